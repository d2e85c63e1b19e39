"""Republishing a window of the archive into Kafka exactly once for read_committed consumers.

Records go out in transactions of one producer whose `transactional.id` the replay's identity names; each
transaction carries the replay's progress too (`state.py`). A run first fences any earlier run of the
same replay, reads the progress back, plans at the snapshots it records (the first run's), and goes on
from there: a finished replay sends nothing again. Each epoch's rows are read whole, put in the replay's
order (`order.py`) and sent; a transaction is committed at the end of every epoch, and inside one after
`TRANSACTION_RECORDS` records or `TRANSACTION_SECONDS`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bergstream.backfill.errors import BackfillError, PlanError
from bergstream.backfill.read.order import Epoch, OrderingPolicy, Window
from bergstream.backfill.read.planner import BackfillPlan, from_micros, plan, table_ref
from bergstream.backfill.read.reader import TableReader
from bergstream.backfill.replay.encode import Encoder, KafkaRecord, kafka_records, table_encoder
from bergstream.backfill.replay.order import Run, epoch_in_order
from bergstream.backfill.replay.state import ReplayIdentity, ReplayProgress, recorded_progress
from bergstream.catalog import CatalogConfig
from bergstream.errors import BergstreamError
from bergstream.kafka_topics import RecordProducer, ensure_topic, topic_partitions
from bergstream.schemas.archive import DEAD_LETTER_SUFFIX, TOPIC_PROPERTY
from bergstream.schemas.schema_registry import SchemaRegistrySettings
from bergstream.signals import on_stop_signals
from bergstream.timeparse import format_instant

log = logging.getLogger("bergstream.backfill.replay")
# librdkafka aborts a transaction open longer than its transaction.timeout.ms (60 s by default): an epoch
# too large to send in a few seconds is committed in parts, each part's progress counting its records.
TRANSACTION_RECORDS = 50_000
TRANSACTION_SECONDS = 10.0
KAFKA_TIMEOUT_SECONDS = 120.0
ENCODED_ROWS = 5_000  # rows turned into records at a time, between which a stop signal is heeded


@dataclass
class ReplayReport:
    topic: str
    records: int = 0  # of this run, as dead_letters and per_partition
    dead_letters: int = 0
    epochs_done: int = 0
    epochs: int = 0
    watermark: str | None = None  # every record ingested before it has been delivered
    seconds: float = 0.0
    per_partition: dict[int, int] = field(default_factory=dict)
    snapshots: dict[str, int | None] = field(default_factory=dict)
    resumed_at: tuple[int, int] | None = None  # (epoch, its records delivered) where an earlier run stopped
    already_complete: bool = False

    def summary(self) -> str:
        snapshots = ", ".join(f"{table} at snapshot {snapshot}" for table, snapshot in self.snapshots.items())
        if self.already_complete:
            return (
                f"the replay into {self.topic} was complete already ({self.epochs} epochs, {snapshots}): "
                "nothing sent"
            )
        rate = (self.records + self.dead_letters) / self.seconds if self.seconds else 0.0
        resumed = ""
        if self.resumed_at is not None:
            epoch, sent = self.resumed_at
            resumed = f", resumed at epoch {epoch}" + (f" after its first {sent:,} records" if sent else "")
        return (
            f"replayed {self.records:,} records and {self.dead_letters:,} dead letters into {self.topic} "
            f"in {self.seconds:.1f}s ({rate:,.0f} records/s), {self.epochs_done} of {self.epochs} epochs, "
            f"to watermark {self.watermark}; read {snapshots}{resumed}"
        )


class _Stopped(Exception):
    """A stop signal came."""


@dataclass
class _Transactions:
    """The replay's producer and its open transaction, which ends with the progress it delivers."""

    producer: RecordProducer
    identity: ReplayIdentity
    report: ReplayReport
    progress: ReplayProgress  # the last committed
    _open: bool = False
    _opened: float = 0.0
    _records: int = 0
    _dead_letters: int = 0

    def send(self, record: KafkaRecord, dead: bool) -> None:
        if not self._open:
            self._begin()
        key, value, headers, timestamp = record
        self.producer.send(self.identity.to_topic, key, value, headers, timestamp)
        if dead:
            self._dead_letters += 1
        else:
            self._records += 1

    @property
    def due(self) -> bool:
        """Whether the open transaction holds enough to be committed before the epoch ends."""
        return (
            self._records + self._dead_letters >= TRANSACTION_RECORDS
            or time.monotonic() - self._opened >= TRANSACTION_SECONDS
        )

    def commit(self, progress: ReplayProgress) -> None:
        if not self._open:
            self._begin()
        self.producer.send(
            self.identity.state_topic, self.identity.digest.encode(), progress.dumps(self.identity), None, 0,
            counted=False,
        )  # fmt: skip
        self.producer.commit_transaction(KAFKA_TIMEOUT_SECONDS)
        self._open = False
        self.progress = progress
        self.report.records += self._records
        self.report.dead_letters += self._dead_letters
        self.report.per_partition = dict(self.producer.delivered)

    def abort(self) -> None:
        if self._open:
            self.producer.abort_transaction(KAFKA_TIMEOUT_SECONDS)
            self._open = False

    def _begin(self) -> None:
        self.producer.begin_transaction()
        self._open, self._opened, self._records, self._dead_letters = True, time.monotonic(), 0, 0


def replay(
    catalog: CatalogConfig,
    table: str,
    window: Window,
    policy: OrderingPolicy,
    to_topic: str,
    producer_config: dict[str, Any],
    regions: list[str] | None = None,
    include_dead_letters: bool = False,
    schema: str | None = None,
    encoding: str | None = None,
    partitions: int | None = None,
    on_epoch: Callable[[ReplayReport], None] | None = None,
    schema_registry: SchemaRegistrySettings | None = None,
) -> ReplayReport:
    """Republish the archive of `table` (and its dead letters) into `to_topic`, epoch by epoch; run again
    with the same arguments, go on where an earlier run stopped.

    `to_topic` is created when missing, with `partitions`, else as many as the source topic has. A table
    of a registry topic is re-encoded with the registry its router read (its properties say which), or
    `schema_registry`."""
    ref = table_ref(table, catalog)
    dead_letter_table = f"{ref.identifier}{DEAD_LETTER_SUFFIX}" if include_dead_letters else None
    tables = (ref.identifier,) + ((dead_letter_table,) if dead_letter_table else ())
    identity = ReplayIdentity(tables, window, policy, tuple(regions) if regions else None, to_topic)
    iceberg = catalog.load()
    archive = iceberg.load_table(ref.pyiceberg_identifier)
    encoder = table_encoder(dict(archive.properties), ref.identifier, schema, encoding, schema_registry)
    source_topic = dict(archive.properties).get(TOPIC_PROPERTY, ref.name)
    ensure_topic(
        producer_config, to_topic, partitions or topic_partitions(producer_config, source_topic) or 1
    )
    started = time.monotonic()
    producer = RecordProducer({**producer_config, "transactional.id": identity.transactional_id})
    try:
        producer.init_transactions(KAFKA_TIMEOUT_SECONDS)
        recorded = recorded_progress(producer_config, identity)
    except BergstreamError as error:
        raise BackfillError(f"replay of {ref.identifier} into {to_topic} cannot start: {error}") from error
    backfill_plan = _plan(catalog, identity, recorded)
    snapshots = {scan.table.identifier: scan.snapshot_id for scan in backfill_plan.tables}
    progress = recorded or ReplayProgress(snapshots, len(backfill_plan.epochs))
    report = ReplayReport(to_topic, epochs=progress.epochs, epochs_done=progress.epoch, snapshots=snapshots)
    if progress.epoch > 0:
        report.watermark = format_instant(from_micros(backfill_plan.epochs[progress.epoch - 1].upper))
    transactions = _Transactions(producer, identity, report, progress)
    if recorded is None:
        # The snapshots are pinned before anything is sent: a run that goes on reads what this one read.
        try:
            transactions.commit(progress)
        except BergstreamError as error:
            transactions.abort()
            raise BackfillError(
                f"replay of {ref.identifier} into {to_topic} cannot start: {error}"
            ) from error
    else:
        report.resumed_at = (recorded.epoch, recorded.sent)
        report.already_complete = recorded.complete
    log.info("replay %s into %s: %s", identity.digest, to_topic, progress)
    readers = [
        TableReader(iceberg.load_table(table_ref(scan.table.identifier, catalog).pyiceberg_identifier),
                    scan, backfill_plan.window, backfill_plan.regions)
        for scan in backfill_plan.tables
        if scan.snapshot_id is not None
    ]  # fmt: skip
    stop = threading.Event()
    with on_stop_signals(stop.set):
        for epoch in backfill_plan.epochs[progress.epoch :]:
            try:
                if stop.is_set():
                    raise _Stopped
                runs = _read(readers, epoch, policy, dead_letter_table)
                _send_epoch(transactions, runs, epoch, encoder, dead_letter_table, stop)
            except _Stopped:
                transactions.abort()
                raise BackfillError(
                    _stopped(transactions, epoch, "stopped by a signal", ref.identifier)
                ) from None
            except BergstreamError as error:
                transactions.abort()
                raise BackfillError(_stopped(transactions, epoch, str(error), ref.identifier)) from error
            except BaseException:
                transactions.abort()
                raise
            report.epochs_done = epoch.index + 1
            report.watermark = format_instant(from_micros(epoch.upper))
            report.seconds = time.monotonic() - started
            if on_epoch is not None:
                on_epoch(report)
    report.seconds = time.monotonic() - started
    return report


def _read(
    readers: list[TableReader], epoch: Epoch, policy: OrderingPolicy, dead_letter_table: str | None
) -> list[Run]:
    """The rows of `epoch` in the order they go out in."""
    try:
        return list(epoch_in_order(readers, epoch, policy.single_reader, dead_letter_table))
    except BergstreamError:
        raise
    except Exception as error:  # pyiceberg's, pyarrow's and the object store's errors alike
        raise BackfillError(f"reading the archive failed: {error!r}") from error


def _send_epoch(
    transactions: _Transactions,
    runs: list[Run],
    epoch: Epoch,
    encoder: Encoder,
    dead_letter_table: str | None,
    stop: threading.Event,
) -> None:
    """Send the rows of `epoch` after those the progress counts delivered, committing a transaction when
    one is due and at the end, with the epoch done. _Stopped when a stop signal came."""
    progress = transactions.progress
    skip = progress.sent if epoch.index == progress.epoch else 0
    sent = 0
    for run in runs:
        dead = run.table == dead_letter_table
        if sent + run.rows.num_rows <= skip:
            sent += run.rows.num_rows
            continue
        rows = run.rows.slice(max(0, skip - sent))
        sent = max(sent, skip)
        for batch in rows.to_batches(max_chunksize=ENCODED_ROWS):
            if stop.is_set():
                raise _Stopped
            for record in kafka_records(batch, encoder, dead):
                transactions.send(record, dead)
                sent += 1
                if transactions.due:
                    transactions.commit(progress.at(epoch.index, sent))
    if stop.is_set():
        raise _Stopped
    transactions.commit(progress.at(epoch.index + 1, 0))


def _plan(catalog: CatalogConfig, identity: ReplayIdentity, recorded: ReplayProgress | None) -> BackfillPlan:
    """The replay's plan: at the snapshots an earlier run recorded, else at the tables' current ones."""
    snapshots = recorded.snapshots if recorded is not None else None
    try:
        made = plan(catalog, identity.tables, identity.window, identity.policy, identity.regions, snapshots)
    except PlanError as error:
        if recorded is None:
            raise
        raise BackfillError(
            f"{error}. The replay into {identity.to_topic} cannot go on at the snapshots its first run "
            f"read; delete topic {identity.state_topic} to start the replays into {identity.to_topic} over"
        ) from error
    if recorded is not None and len(made.epochs) != recorded.epochs:
        raise BackfillError(
            f"the replay into {identity.to_topic} planned {recorded.epochs} epochs at first, and "
            f"{len(made.epochs)} now at the same snapshots: delete topic {identity.state_topic} to start over"
        )
    return made


def _stopped(transactions: _Transactions, epoch: Epoch, reason: str, table: str) -> str:
    progress, identity = transactions.progress, transactions.identity
    done = (
        f"epochs 0 to {progress.epoch - 1} were delivered whole"
        if progress.epoch
        else "no epoch was delivered whole"
    )
    if progress.sent:
        done += f", and the first {progress.sent:,} records of epoch {progress.epoch}"
    return (
        f"replay of {table} into {identity.to_topic} stopped in epoch {epoch.index} "
        f"({format_instant(from_micros(epoch.lower))} to {format_instant(from_micros(epoch.upper))}): "
        f"{reason}. Its open transaction was aborted: read_committed consumers see none of its records. "
        f"{done[0].upper()}{done[1:]}; the same command goes on from there (progress in topic "
        f"{identity.state_topic})"
    )
