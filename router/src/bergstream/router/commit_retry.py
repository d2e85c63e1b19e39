"""A batch's commit, tried again with backoff while the catalog or the warehouse is unavailable (retry.py
tells an outage from an error that no wait would mend)."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from bergstream.router.errors import RouterStopped, StopRequested
from bergstream.router.metrics import RouterMetrics
from bergstream.router.retry import CommitRetrySettings, java_causes, transient_reason

log = logging.getLogger("bergstream.router")
T = TypeVar("T")


class CommitRetry:
    """Waits out commit outages of one topic, and measures them (`commit_outage_seconds`)."""

    def __init__(
        self, topic: str, settings: CommitRetrySettings, metrics: RouterMetrics, stopping: threading.Event
    ) -> None:
        self.topic = topic
        self.settings = settings
        self.metrics = metrics
        self.stopping = stopping
        # When the catalog or the warehouse stopped taking commits; None while they take them.
        self._outage_started: float | None = None
        metrics.commit_outage.labels(topic).set_function(self.outage_seconds)

    def outage_seconds(self) -> float:
        started = self._outage_started
        return 0.0 if started is None else time.time() - started

    def attempt(self, identifier: str, batch_id: int, attempt: Callable[[], T]) -> T:
        """`attempt()`, tried again with backoff while committing batch `batch_id` to `identifier` meets
        an outage; the outage's length is bounded by `give_up_after_seconds`."""
        topic, settings = self.topic, self.settings
        delays = settings.delays()
        for number in itertools.count(1):
            try:
                result = attempt()
            except Exception as error:
                reason = transient_reason(java_causes(error))
                if reason is None:
                    raise
                if self._outage_started is None:
                    self._outage_started = time.time()
                waited = time.time() - self._outage_started
                if waited >= settings.give_up_after_seconds:
                    raise RouterStopped(
                        f"{topic} batch {batch_id}: {identifier} could not be committed for "
                        f"{waited:.0f}s ({reason}); set aside after {number} attempts (commit_retry)"
                    ) from error
                delay = next(delays)
                self.metrics.commit_retries.labels(topic, identifier).inc()
                log.warning(
                    "%s batch %d: committing to %s failed (attempt %d, %.0fs into the outage): %s; "
                    "trying again in %.1fs",
                    topic, batch_id, identifier, number, waited, reason, delay,
                )  # fmt: skip
                if self.stopping.wait(delay):
                    raise StopRequested(
                        f"{topic}: stopped while batch {batch_id} waited for {identifier}; "
                        "it is archived when the router starts again"
                    ) from error
                continue
            if self._outage_started is not None:
                log.warning(
                    "%s batch %d: committed to %s after %d attempts, %.0fs after the outage began",
                    topic, batch_id, identifier, number, time.time() - self._outage_started,
                )  # fmt: skip
                self._outage_started = None
            return result
        raise AssertionError("unreachable")
