"""Waiting out an outage of the catalog or of the warehouse while a batch is committed.

When the catalog's database is down, or the warehouse is full or read-only, a batch's append fails. The
records are still in Kafka and Spark holds the batch until its function returns, so the router tries the
append again with exponential backoff instead of failing the query, and goes on when the outage ends. Every
attempt is idempotent (write.py): an attempt whose commit did land before its error is found, not repeated.
Other errors (a schema the table refuses, a dropped table) fail at once, since no wait would mend them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# Java exceptions, matched along the cause chain, that say the catalog or the storage is unavailable for
# now: connections refused or lost, commits whose outcome is unknown, files that cannot be written.
_TRANSIENT_CLASSES = (
    "java.sql.SQLTransientException",
    "java.sql.SQLRecoverableException",
    "java.sql.SQLNonTransientConnectionException",
    "java.io.IOException",
    "java.io.UncheckedIOException",
    "java.net.ConnectException",
    "java.net.SocketTimeoutException",
    "org.apache.iceberg.exceptions.CommitStateUnknownException",
    "org.apache.iceberg.exceptions.CommitFailedException",
    "org.apache.iceberg.exceptions.RuntimeIOException",
    "org.apache.iceberg.exceptions.ServiceUnavailableException",
    "org.apache.iceberg.exceptions.ServiceFailureException",
)
# Kafka's errors that say it cannot serve now (a timeout, a broker gone, a leader moving): every one of them
# is a RetriableException.
_KAFKA_RETRIABLE = "org.apache.kafka.common.errors.RetriableException"
# SQLSTATE classes of a database that cannot serve now: 08 connection exception, 53 insufficient
# resources, 57P operator intervention (shutting down, starting up), 40001 serialization failure.
_TRANSIENT_SQL_STATES = ("08", "53", "57P", "40001")


class Backoff(BaseModel):
    """Waits that double from `initial_backoff_seconds` on each failure in a row, capped."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    initial_backoff_seconds: float = Field(default=1.0, gt=0)
    max_backoff_seconds: float = Field(default=30.0, gt=0)

    def delay(self, failures_in_a_row: int) -> float:
        """The wait after the `failures_in_a_row`-th failure in a row (1 for the first)."""
        doublings = min(max(failures_in_a_row - 1, 0), 62)
        return min(self.max_backoff_seconds, self.initial_backoff_seconds * 2.0**doublings)

    def delays(self) -> Iterator[float]:
        """The waits before the second, third, ... attempt."""
        for failures in itertools.count(1):
            yield self.delay(failures)


class CommitRetrySettings(Backoff):
    """How long a router waits for its catalog and warehouse to come back before it gives up."""

    # Past this the batch goes on without the topic: its share is set aside by Kafka range and archived from
    # Kafka once its tables take commits again (router/driver/behind.py).
    give_up_after_seconds: float = Field(default=60.0, ge=0)


@dataclass(frozen=True)
class JavaCause:
    """One exception of a Java cause chain."""

    classes: tuple[str, ...]  # its class and its superclasses
    message: str
    sql_state: str | None

    @property
    def line(self) -> str:
        return f"{self.classes[0].rsplit('.', 1)[-1]}: {self.message}" if self.message else self.classes[0]


def java_causes(error: BaseException) -> list[JavaCause]:
    """The Java exception behind a PySpark or py4j error, and its causes; empty for a Python error."""
    throwable: Any = getattr(error, "java_exception", None) or getattr(error, "_origin", None)
    causes: list[JavaCause] = []
    while throwable is not None and len(causes) < 20:
        classes = []
        java_class = throwable.getClass()
        while java_class is not None:
            classes.append(str(java_class.getName()))
            java_class = java_class.getSuperclass()
        sql_state = str(throwable.getSQLState()) if "java.sql.SQLException" in classes else None
        message = str(throwable.getMessage() or "").strip().splitlines()
        causes.append(JavaCause(tuple(classes), message[0] if message else "", sql_state))
        throwable = throwable.getCause()
    return causes


def transient_reason(causes: list[JavaCause]) -> str | None:
    """One line naming the outage when `causes` show one worth waiting out; None otherwise."""
    transient = [
        cause
        for cause in causes
        if any(name in cause.classes for name in _TRANSIENT_CLASSES)
        or (cause.sql_state or "").startswith(_TRANSIENT_SQL_STATES)
    ]
    if not transient:
        return None
    # The deepest cause that says something says most: "... (Read-only file system)", "Connection refused".
    worded = [cause for cause in transient if cause.message]
    return (worded or transient)[-1].line


def kafka_unavailable(causes: list[JavaCause]) -> str | None:
    """One line naming Kafka's failure when `causes` show Kafka unable to serve a read now; None otherwise."""
    retriable = [cause for cause in causes if _KAFKA_RETRIABLE in cause.classes]
    return retriable[-1].line if retriable else None
