"""The branch a correction's backfill writes: made from main's current snapshot with main's rows of the window
removed, in a transaction that records the correction in the table's properties (state.py)."""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from bergstream.backfill.errors import BackfillError
from bergstream.backfill.read.planner import from_micros
from bergstream.runtime.checkpoint import CheckpointFiles, committed_watermark
from bergstream.runtime.correct.identity import identity_of
from bergstream.runtime.correct.state import Correction, property_name
from bergstream.runtime.settings import AppSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("bergstream.correct")
# Every snapshot of a correction's branch is kept while its backfill runs: its publish applies their changes.
# Once complete, the branch keeps those since its base alone, not main's older history before it.
_KEEP_ALL = 2**31 - 1
# The seconds of each step of the last run's end (mark_complete), for its log and the benchmark.
LAST_STEPS: dict[str, float] = {}
# Attempts at making a branch while other commits (the live query's) land on main.
COMMIT_ATTEMPTS = 5
# Iceberg's default of history.expire.max-snapshot-age-ms: five days.
DEFAULT_MAX_SNAPSHOT_AGE_MS = 5 * 24 * 3600 * 1000
# While a correction is open, main keeps its snapshots at least this long (its ref's max snapshot age, which
# snapshot expiry follows whatever its arguments): a publish and an unpublish validate main's history since
# the branch was made. Main's own setting before is kept in HELD, and put back by the last release.
HOLD_MS = 7 * 24 * 3600 * 1000
HELD = "bergstream.held.main-max-snapshot-age-ms"
# A publish's tag is kept whatever the table's history.expire.max-ref-age-ms: an unpublish reads its files.
KEEP_FOREVER_MS = 2**63 - 1


def java_list(iterable: Any) -> list[Any]:
    """A Java collection's items."""
    iterator = iterable.iterator()
    found = []
    while iterator.hasNext():
        found.append(iterator.next())
    return found


class IcebergTable:
    """An Iceberg table through Spark's JVM: its properties, refs and snapshots, and the commits a correction
    makes with Iceberg's own API."""

    def __init__(self, spark: SparkSession, identifier: str) -> None:
        self.spark = spark
        self.identifier = identifier
        jvm: Any = spark._jvm
        self._util = getattr(jvm, "org.apache.iceberg.spark.Spark3Util")
        self.expressions = getattr(jvm, "org.apache.iceberg.expressions.Expressions")
        self.table = self._util.loadIcebergTable(spark._jsparkSession, identifier)

    def refresh(self) -> None:
        self.table.refresh()

    def property(self, name: str) -> str | None:
        value = self.table.properties().get(name)
        return None if value is None else str(value)

    def correction(self, branch: str) -> Correction | None:
        text = self.property(property_name(branch))
        return Correction.loads(text) if text is not None else None

    def save(self, correction: Correction) -> None:
        self.table.updateProperties().set(property_name(correction.branch), correction.dumps()).commit()

    def branch_head(self, branch: str) -> int | None:
        ref = self.table.refs().get(branch)
        return None if ref is None or not ref.isBranch() else int(ref.snapshotId())

    def ancestors(self, head: int | None, until: int | None = None) -> list[Any]:
        """The snapshots from `head` back to `until` (not included), newest first."""
        found = []
        snapshot = self.table.snapshot(head) if head is not None else None
        while snapshot is not None and int(snapshot.snapshotId()) != until:
            found.append(snapshot)
            parent = snapshot.parentId()
            snapshot = self.table.snapshot(parent) if parent is not None else None
        return found

    def reaches(self, head: int | None, until: int) -> bool:
        """Whether the history from `head` back to `until` is whole: no snapshot between them expired
        (Iceberg's walk of the parents, in the JVM)."""
        if head is None:
            return False
        util = getattr(self.spark._jvm, "org.apache.iceberg.util.SnapshotUtil")
        return head == until or bool(util.isParentAncestorOf(self.table, head, until))

    def main_snapshot_age(self) -> tuple[int | None, int]:
        """Main's own max snapshot age (None: not set), and the one snapshot expiry follows: its own, else
        history.expire.max-snapshot-age-ms, else Iceberg's five days."""
        ref = self.table.refs().get("main")
        own = ref.maxSnapshotAgeMs() if ref is not None else None
        if own is not None:
            return int(own), int(own)
        configured = self.property("history.expire.max-snapshot-age-ms")
        return None, int(configured) if configured is not None else DEFAULT_MAX_SNAPSHOT_AGE_MS

    def history_kept_until(self, correction: Correction) -> datetime | None:
        """When main's snapshots since the branch's base become old enough for snapshot expiry under the
        table's retention (main's own, else history.expire.max-snapshot-age-ms, else Iceberg's five days);
        None when the base is gone already."""
        base = self.table.snapshot(correction.base)
        if base is None:
            return None
        _, age = self.main_snapshot_age()
        return datetime.fromtimestamp((int(base.timestampMillis()) + age) / 1000, UTC)

    def window(self, correction: Correction) -> Any:
        """The Iceberg expression of a row in the correction's window widened to the spans that cross its
        edges (what its publish replaces), by its time column."""
        from bergstream.backfill.read.planner import to_micros

        start, end = correction.replaced
        both = getattr(self.expressions, "and")
        return both(
            self.expressions.greaterThanOrEqual(correction.time_column, to_micros(start)),
            self.expressions.lessThan(correction.time_column, to_micros(end)),
        )


def prepare_branch(spark: SparkSession, settings: AppSettings, identifier: str) -> Correction:
    """The correction's branch, made from main when new (in one commit with its record), then cleared of
    main's rows of the window once, before the query starts: a resumed backfill finds it as it left it. A
    run asked to start over releases the branch's earlier correction first. (Cleared beside the query's
    start instead, the clearing's tasks slow the first batches by more than it takes: bench/README.md.)"""
    from bergstream.runtime.correct.release import release

    table = IcebergTable(spark, identifier)
    correct = settings.backfill.correct
    assert correct is not None
    requested = identity_of(settings)
    known = table.correction(correct.branch)
    if known is not None and (known.identity is None or known.identity.run != requested.run):
        if not correct.start_over or known.published:
            raise BackfillError(
                f"{identifier}: branch {correct.branch} is another run's correction now (made while this "
                "one started): nothing was written; run the command again to see what it records"
            )
        log.info("%s: starting the correction in branch %s over: %s", identifier, correct.branch,
                 ", ".join(release(spark, settings.catalog, identifier, correct.branch)))  # fmt: skip
        table.refresh()
        known = None
    if known is None and _holds_a_query(spark, requested.checkpoint):
        raise BackfillError(
            f"{identifier}: checkpoint {requested.checkpoint} holds another query's progress: a new "
            f"correction in branch {correct.branch} starts from a checkpoint of its own; leave --checkpoint "
            "out, or name a new one"
        )
    correction = make_branch(table, settings)
    if correction.cleared:
        log.info(
            "%s: resuming the correction of %s in branch %s", identifier, correction.window, correction.branch
        )
        return correction
    return clear_branch(table, correction)


def _holds_a_query(spark: SparkSession, checkpoint: str) -> bool:
    files = CheckpointFiles(spark, checkpoint)
    return files.exists("metadata") or files.exists("offsets")


def make_branch(table: IcebergTable, settings: AppSettings) -> Correction:
    """The correction's record; its branch made from main's current snapshot, in one commit with the record,
    when it has none yet."""
    from bergstream.runtime.correct.edges import drop_staging

    correct = settings.backfill.correct
    output = settings.output
    assert correct is not None and output.time_column is not None and output.key is not None
    correction = table.correction(correct.branch)
    if correction is not None:
        return correction
    drop_staging(table.spark, table.identifier, correct.branch)  # an earlier run's of that name
    attempt = 1
    while True:
        # Beside a live query committing to main: a commit that lost the race is made again from main's new
        # snapshot (Iceberg's own retry keeps the refs it read first, and fails the same way).
        table.refresh()
        try:
            made = _made_branch(table, settings)
            break
        except Exception as error:
            if "CommitFailedException" not in str(error) or attempt == COMMIT_ATTEMPTS:
                raise
            attempt += 1
            log.info("%s: main moved on while branch %s was made; again", table.identifier, correct.branch)
    correction = made
    log.info("%s: branch %s made from main's snapshot %d to correct %s", table.identifier, correct.branch,
             correction.base, correction.window)  # fmt: skip
    return correction


def _made_branch(table: IcebergTable, settings: AppSettings) -> Correction:
    """The branch made from main's current snapshot with its record, and main's snapshots held, in one
    commit."""
    correct, output = settings.backfill.correct, settings.output
    assert correct is not None and output.time_column is not None and output.key is not None
    base = table.table.currentSnapshot()
    assert base is not None, "checked before Spark started"
    time_type = str(table.table.schema().findField(output.time_column).type())
    correction = Correction(
        app=settings.app, branch=correct.branch, time_column=output.time_column, key=tuple(output.key),
        start=correct.start, end=correct.end, base=int(base.snapshotId()), identity=identity_of(settings),
        time_zoned=time_type == "timestamptz", end_column=output.end_column,
    )  # fmt: skip
    own, age = table.main_snapshot_age()
    transaction = table.table.newTransaction()
    manage = transaction.manageSnapshots().createBranch(correct.branch, correction.base)
    manage.setMinSnapshotsToKeep(correct.branch, _KEEP_ALL)
    if age < HOLD_MS:
        manage.setMaxSnapshotAgeMs("main", HOLD_MS)
    manage.commit()
    properties = transaction.updateProperties().set(property_name(correct.branch), correction.dumps())
    if age < HOLD_MS and table.property(HELD) is None:
        properties.set(HELD, str(own) if own is not None else "unset")
    properties.commit()
    transaction.commitTransaction()
    return correction


def clear_branch(table: IcebergTable, correction: Correction) -> Correction:
    """Main's rows of the window removed from the branch, before any of the backfill's: the files that hold
    rows on both sides of the window are rewritten. Recorded, so that it is done once."""
    table.spark.sql(
        f"DELETE FROM {table.identifier}.branch_{correction.branch} WHERE {correction.window_sql()}"
    )
    table.refresh()
    correction = correction.but(cleared=True)
    table.save(correction)
    log.info(
        "%s: branch %s holds none of main's rows of %s",
        table.identifier,
        correction.branch,
        correction.window,
    )
    return correction


def mark_complete(
    spark: SparkSession, settings: AppSettings, identifier: str, watermarked: bool
) -> Correction:
    """The backfill into the correction's branch covered its read window: recorded with the application's
    event-time watermark that its query's last committed micro-batch ran with, read from its checkpoint (a
    run killed after its last batch and run again reads nothing, and finds it all the same). A publish
    checks it against the window (checks.py). The keys the branch repeats are counted once, here."""
    from bergstream.runtime.correct.audit import repeated_keys
    from bergstream.runtime.correct.edges import edge_spans, widen
    from bergstream.runtime.correct.writer import copy_window

    correct = settings.backfill.correct
    assert correct is not None
    table = IcebergTable(spark, identifier)
    correction = table.correction(correct.branch)
    assert correction is not None, "made before the query started"
    millis = committed_watermark(CheckpointFiles(spark, settings.checkpoint_location))
    watermark = from_micros(millis * 1000) if millis is not None else None
    done = correction.but(complete=True, watermark=watermark, watermarked=watermarked)
    steps = LAST_STEPS
    steps.clear()
    started = time.monotonic()

    def step(name: str) -> None:
        nonlocal started
        steps[name] = time.monotonic() - started
        started = time.monotonic()

    head = table.branch_head(correct.branch)
    if not correction.complete:
        # Three jobs side by side (each mostly waits on its commits and small reads): the run's rows of the
        # window copied into the branch, the spans across the window's edges found, the keys it repeats
        # counted (from the run's rows of the window: what the copy puts in the branch).
        identity = correction.identity or identity_of(settings)
        read = (identity.read_start, identity.read_end)
        with ThreadPoolExecutor(max_workers=3) as pool:
            copied = pool.submit(copy_window, spark, IcebergTable(spark, identifier), correction)
            found = pool.submit(edge_spans, spark, identifier, done, read) if done.end_column else None
            counted = pool.submit(repeated_keys, spark, identifier, correction, staged=True)
            copied.result()
            step("copy")
            if found is not None:
                table.refresh()
                done = widen(spark, table, done, read, found.result())
                step("edges")
            repeated = counted.result()
        head = table.branch_head(correct.branch)
        done = done.but(repeated_keys=repeated, checked_head=head)
        step("keys")
    elif correction.checked_head != head or correction.repeated_keys is None:
        done = done.but(repeated_keys=repeated_keys(spark, identifier, correction), checked_head=head)
        step("keys")
    if done != correction:
        own = len(table.ancestors(head, correction.base)) + 1
        transaction = table.table.newTransaction()
        transaction.manageSnapshots().setMinSnapshotsToKeep(correct.branch, own).commit()
        transaction.updateProperties().set(property_name(correct.branch), done.dumps()).commit()
        transaction.commitTransaction()
        step("record")
    log.info("%s: correction in branch %s complete: %s", identifier, correct.branch,
             ", ".join(f"{name} {seconds:.2f} s" for name, seconds in steps.items()))  # fmt: skip
    return done
