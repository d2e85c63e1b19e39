"""Publish a correction: main's rows of the window replaced by the branch's in one commit on main.

The branch holds, since the snapshot of main it was made from (its base), exactly the correction's changes:
the files its clearing of the window removed or rewrote, and the files the backfill added. The publish makes
those changes on main as it is now, in one Iceberg transaction: an overwrite that removes the same files and
adds the branch's, validated against every commit on main since the base (a commit that wrote rows of the
window since is a conflict, and so is one that removed or rewrote a file the publish removes), the tag on
main's snapshot before it, and the correction's record. What the live query appended meanwhile is kept: its
files are neither removed nor added again. Run again after a crash, it finds its commit and publishes once.

An unpublish makes the publish's changes undone the same way: one overwrite that removes the files it added
and adds back those it removed, validated against every commit since the publish.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from bergstream.backfill.errors import BackfillError
from bergstream.backfill.read.planner import from_micros
from bergstream.runtime.correct.audit import duplicated_keys
from bergstream.runtime.correct.branch import KEEP_FOREVER_MS, IcebergTable, java_list
from bergstream.runtime.correct.state import BRANCH, PUBLISH_ID, UNPUBLISH_ID, Correction, property_name
from bergstream.timeparse import format_duration, format_instant

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("bergstream.correct")
# How long a publish keeps trying while other commits on main (the live query's) win the race.
COMMIT_PATIENCE = 300.0


@dataclass(frozen=True)
class Published:
    """What a publish (or an unpublish) did on main."""

    table: str
    branch: str
    window: str
    action: str  # publish, unpublish
    snapshot: int
    tag: str | None
    files_removed: int
    files_added: int
    rows_removed: int
    rows_added: int
    seconds: float
    # It was done by an earlier run of the same command.
    already: bool = False

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()

    def lines(self) -> list[str]:
        done = "was done already" if self.already else f"done in {self.seconds:.1f}s"
        head = (
            f"{self.action} of branch {self.branch} into main of {self.table}, window {self.window}: {done}"
        )
        lines = [
            head,
            f"  main's snapshot {self.snapshot}: {self.rows_removed:,} rows removed "
            f"({self.files_removed} files), {self.rows_added:,} rows added ({self.files_added} files)",
        ]
        if self.tag is not None and self.action == "publish":
            lines.append(
                f"  main before it is tag {self.tag}; `backfill unpublish` puts the window's rows back"
            )
        return lines


class Conflict(BackfillError):
    """Main changed the window since the branch was made (or since the publish, for an unpublish)."""


class HistoryExpired(BackfillError):
    """Snapshots a publish or an unpublish checks against have expired."""


def find_commit(table: IcebergTable, key: str, value: str, until: int | None) -> int | None:
    """The snapshot among main's since `until` whose summary says `key` is `value`."""
    current = table.table.currentSnapshot()
    for snapshot in table.ancestors(int(current.snapshotId()) if current is not None else None, until):
        if snapshot.summary().get(key) == value:
            return int(snapshot.snapshotId())
    return None


def _changes(table: IcebergTable, head: int | None, since: int) -> tuple[list[Any], list[Any]]:
    """The data files the snapshots from `since` (excluded) to `head` removed of `since`'s, and those they
    added and kept: what those snapshots changed."""
    removed: dict[str, Any] = {}
    added: dict[str, Any] = {}
    for snapshot in reversed(table.ancestors(head, since)):
        io = table.table.io()
        if java_list(snapshot.addedDeleteFiles(io)):
            raise BackfillError(
                f"{table.identifier}: snapshot {snapshot.snapshotId()} added delete files: a correction "
                "replaces whole files (copy-on-write); set write.delete.mode copy-on-write and correct again"
            )
        for file in java_list(snapshot.removedDataFiles(io)):
            location = str(file.location())
            if added.pop(location, None) is None:
                removed[location] = file
        for file in java_list(snapshot.addedDataFiles(io)):
            added[str(file.location())] = file
    return list(removed.values()), list(added.values())


def _conflicting(table: IcebergTable, message: str, since: int) -> str:
    """The snapshots since `since` that added or removed a file the validation's `message` names."""
    found = []
    current = table.table.currentSnapshot()
    for snapshot in table.ancestors(int(current.snapshotId()), since):
        io = table.table.io()
        files = java_list(snapshot.addedDataFiles(io)) + java_list(snapshot.removedDataFiles(io))
        if any(str(file.location()) in message for file in files):
            when = datetime.fromtimestamp(snapshot.timestampMillis() / 1000, UTC).isoformat()
            found.append(f"snapshot {snapshot.snapshotId()} ({snapshot.operation()}, committed {when})")
    first = message.strip().splitlines()[0] if message.strip() else "a conflicting commit"
    return f"{first[:300]}: {', '.join(found)}" if found else first[:600]


def _apply(
    table: IcebergTable,
    correction: Correction,
    removed: list[Any],
    added: list[Any],
    since: int,
    summary: tuple[str, str],
    recorded: Correction,
    tag: str | None,
    keep_later_rows: bool = False,
) -> None:
    """One transaction on main: the overwrite (validated since `since`), the tag on main's snapshot before
    it, the correction's record; `summary` (key, value) marks its snapshot. Tried again while other commits
    (the live query's) win the race, for up to COMMIT_PATIENCE seconds; a commit whose outcome is unknown is
    looked for before it is tried again. An unpublish that `keep_later_rows` lets rows written into the window
    since stay, validating only that no file it removes or adds back was removed since."""
    deadline = time.monotonic() + COMMIT_PATIENCE
    attempt = 0
    while True:
        attempt += 1
        table.refresh()
        if find_commit(table, *summary, since) is not None:
            return  # an attempt whose outcome was unknown landed
        try:
            # The overwrite is validated as it is staged, and again if the transaction is tried again.
            transaction = table.table.newTransaction()
            if tag is not None:
                current = table.table.currentSnapshot()
                # Kept whatever the table's history.expire.max-ref-age-ms: an unpublish reads its files.
                manage = transaction.manageSnapshots().createTag(tag, current.snapshotId())
                manage.setMaxRefAgeMs(tag, KEEP_FOREVER_MS).commit()
            overwrite = transaction.newOverwrite()
            for file in removed:
                overwrite.deleteFile(file)
            for file in added:
                overwrite.addFile(file)
            overwrite.validateFromSnapshot(since).conflictDetectionFilter(table.window(correction))
            if not keep_later_rows:
                overwrite.validateNoConflictingData()
            overwrite.validateNoConflictingDeletes()
            overwrite.set(BRANCH, correction.branch).set(*summary)
            overwrite.commit()
            transaction.updateProperties().set(property_name(correction.branch), recorded.dumps()).commit()
            transaction.commitTransaction()
            return
        except Exception as error:
            conflict = _java_message(error, ("ValidationException",))
            if conflict is not None:
                table.refresh()
                changed = (
                    f"{table.identifier}: main changed the window {correction.replaced_window} after "
                    f"{'the branch was made' if tag is not None else 'the publish'} (snapshot {since}): "
                    f"{_conflicting(table, conflict, since)}. Nothing was changed."
                )
                if tag is not None:
                    raise Conflict(
                        f"{changed} Correct again: `backfill run --app {correction.app} --branch "
                        f"{correction.branch} --start-over` with its window backfills it into the branch "
                        "made again from main as it is"
                    ) from error
                raise Conflict(
                    f"{changed} `backfill verify --app {correction.app} --branch {correction.branch}` shows "
                    f"the rows written into the window since; tag {recorded.tag} still holds main's rows "
                    "from before the publish. `backfill unpublish ... --keep-later-rows` puts those back and "
                    "keeps the rows written since"
                ) from error
            raced = _java_message(error, ("CommitFailedException", "CommitStateUnknownException"))
            if raced is None or time.monotonic() > deadline:
                raise
            log.warning("%s: commit %d lost to another (%s); trying again", table.identifier, attempt,
                        raced.splitlines()[0] if raced else "")  # fmt: skip
            time.sleep(min(2.0, 0.1 * attempt))


def _java_message(error: BaseException, names: tuple[str, ...]) -> str | None:
    """The whole message of the Java exception among `error`'s causes whose class is one of `names`."""
    throwable: Any = getattr(error, "java_exception", None)
    while throwable is not None:
        if str(throwable.getClass().getSimpleName()) in names:
            return str(throwable.getMessage())
        throwable = throwable.getCause()
    return None


def publish(spark: SparkSession, identifier: str, branch: str, live_checkpoint: str | None) -> Published:
    """Replace main's rows of the correction's window with its branch's, in one commit, once the live query
    (of `live_checkpoint`; None: no live query writes the output) has written every row the branch holds."""
    started = time.monotonic()
    table = IcebergTable(spark, identifier)
    correction = table.correction(branch)
    assert correction is not None, "checked before Spark started"
    if correction.published:
        assert correction.publish_id is not None
        snapshot = find_commit(table, PUBLISH_ID, correction.publish_id, correction.base)
        return _report(table, correction, "publish", snapshot, started, already=True)
    if live_checkpoint is not None:
        _check_live_query(spark, identifier, correction, live_checkpoint)
    _check_columns(table, correction)
    # The branch's keys were counted as its run completed: main is looked at only for keys it repeats.
    unchanged = correction.checked_head is not None and correction.checked_head == table.branch_head(branch)
    duplicated = (
        0 if unchanged and correction.repeated_keys == 0 else duplicated_keys(spark, identifier, correction)
    )
    if duplicated:
        raise BackfillError(
            f"{identifier}: branch {branch} holds {duplicated:,} keys of the window more often than main, "
            "and more than once: the publish would duplicate their rows. Nothing was changed; `backfill "
            "audit` names them, and a correction started over (`backfill run ... --start-over`) writes each "
            "row once"
        )
    # After an unpublish, main holds the base's files again as of the unpublish's commit.
    since = correction.base
    if correction.unpublish_id is not None:
        since = find_commit(table, UNPUBLISH_ID, correction.unpublish_id, correction.base) or correction.base
    _check_history(table, correction, since)
    removed, added = _changes(table, table.branch_head(branch), correction.base)
    publish_id = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    tag = f"{branch}-before-{publish_id}"
    recorded = correction.but(publish_id=publish_id, tag=tag, unpublish_id=None)
    _apply(table, correction, removed, added, since, (PUBLISH_ID, publish_id), recorded, tag)
    table.refresh()
    snapshot = find_commit(table, PUBLISH_ID, publish_id, since)
    _tag_parent(table, tag, snapshot)
    log.info("%s: branch %s published into main at snapshot %s, main before it tagged %s", identifier, branch,
             snapshot, tag)  # fmt: skip
    return _report(table, recorded, "publish", snapshot, started)


def _check_columns(table: IcebergTable, correction: Correction) -> None:
    """Main's columns are the branch's: a column added to the output since the branch was made is missing
    from the branch's files, and its published rows would read null there."""
    base = table.table.snapshot(correction.base)
    schemas = table.table.schemas()
    if base is None or base.schemaId() is None or schemas.get(base.schemaId()) is None:
        return
    known = {int(field.fieldId()) for field in java_list(schemas.get(base.schemaId()).columns())}
    added = [
        str(field.name())
        for field in java_list(table.table.schema().columns())
        if int(field.fieldId()) not in known
    ]
    if added:
        raise BackfillError(
            f"{table.identifier}: column(s) {', '.join(added)} were added to the output after branch "
            f"{correction.branch} was made: its rows lack them, and would read null in main. Nothing was "
            f"changed; correct the window again (`backfill run --app {correction.app} --branch "
            f"{correction.branch} --start-over` with its window)"
        )


def _check_history(table: IcebergTable, correction: Correction, since: int) -> None:
    """Main's history since `since` and the branch's since its base are whole: a publish checks every commit
    of main since the branch was made against the window, and applies every commit of the branch."""
    current = table.table.currentSnapshot()
    main_whole = table.reaches(int(current.snapshotId()), since)
    branch_whole = table.reaches(table.branch_head(correction.branch), correction.base)
    if not (main_whole and branch_whole):
        expired = "main's history since the branch was made" if not main_whole else "the branch's history"
        raise HistoryExpired(
            f"{table.identifier}: {expired} ({correction.branch}, made from main's snapshot "
            f"{correction.base}) has expired (snapshot expiry removed some of it): the publish can no longer "
            "check what was written into the window since. Nothing was changed; correct the window again "
            f"(`backfill run --app {correction.app} --branch {correction.branch} --start-over` with its "
            "window), and publish it before main's snapshots of that age expire (`backfill audit` shows when)"
        )


def _tag_parent(table: IcebergTable, tag: str, publish: int | None) -> None:
    """The tag on main's snapshot just before the publish: where Iceberg retried the commit on a newer main
    (the live query's commit won the race), the tag made with it names an older one, and is moved."""
    if publish is None:
        return
    parent = table.table.snapshot(publish).parentId()
    ref = table.table.refs().get(tag)
    if parent is not None and ref is not None and int(ref.snapshotId()) != int(parent):
        table.table.manageSnapshots().replaceTag(tag, parent).commit()
        table.refresh()


def _check_live_query(spark: SparkSession, identifier: str, correction: Correction, checkpoint: str) -> None:
    """The live query has written every row of the window the branch holds: its event-time watermark has
    passed the backfill's, so that it appends none of them after the publish. A live query stopped or behind
    is refused, saying how far it is."""
    from bergstream.runtime.checkpoint import CheckpointFiles, committed_batches, committed_watermark

    files = CheckpointFiles(spark, checkpoint)
    if not committed_batches(files):
        raise BackfillError(
            f"{identifier}: no live query has committed a batch in its checkpoint {checkpoint}: one started "
            "after the publish would append the window's rows again. Publish once it runs (the application's "
            "checkpoint_location names it), or with --no-live-query when no live query writes this output"
        )
    if not correction.watermarked or correction.watermark is None:
        return
    millis = committed_watermark(files)
    live = from_micros(millis * 1000) if millis is not None else None
    if live is None or live < correction.watermark:
        at = format_instant(live) if live is not None else "none yet"
        behind = f", {format_duration(correction.watermark - live)} behind" if live is not None else ""
        raise BackfillError(
            f"{identifier}: the live query (checkpoint {checkpoint}) is at event-time watermark {at}, before "
            f"the backfill's {format_instant(correction.watermark)}{behind}: it has yet to write rows of the "
            f"window {correction.window}, and would append them after the publish. Nothing was changed; "
            "publish once it has caught up (a stopped one started again)"
        )


def unpublish(spark: SparkSession, identifier: str, branch: str, keep_later_rows: bool = False) -> Published:
    """Put main's rows of the window back as they were before the correction's publish, in one commit;
    `keep_later_rows`: and keep the rows written into the window since (the live query's)."""
    started = time.monotonic()
    table = IcebergTable(spark, identifier)
    correction = table.correction(branch)
    assert correction is not None, "checked before Spark started"
    if correction.publish_id is None:
        raise BackfillError(
            f"{identifier}: branch {branch} was never published: there is nothing to unpublish"
        )
    if correction.unpublish_id is not None:
        snapshot = find_commit(table, UNPUBLISH_ID, correction.unpublish_id, correction.base)
        return _report(table, correction, "unpublish", snapshot, started, already=True)
    published = find_commit(table, PUBLISH_ID, correction.publish_id, correction.base)
    if published is None:
        current = table.table.currentSnapshot()
        if not table.reaches(int(current.snapshotId()), correction.base):
            raise HistoryExpired(
                f"{identifier}: the publish {correction.publish_id} of branch {branch} is no longer in "
                "main's history: snapshot expiry removed it, and the commits it made can no longer be undone "
                f"one by one. Nothing was changed; tag {correction.tag} still holds main as it was before "
                "the publish (read it with VERSION AS OF)"
            )
        raise BackfillError(
            f"{identifier}: the publish {correction.publish_id} of branch {branch} is not in main's history "
            "(rolled back?): there is nothing to unpublish"
        )
    snapshot = table.table.snapshot(published)
    io = table.table.io()
    added, removed = java_list(snapshot.addedDataFiles(io)), java_list(snapshot.removedDataFiles(io))
    unpublish_id = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    recorded = correction.but(unpublish_id=unpublish_id)
    _apply(table, correction, added, removed, published, (UNPUBLISH_ID, unpublish_id), recorded, None,
           keep_later_rows)  # fmt: skip
    table.refresh()
    done = find_commit(table, UNPUBLISH_ID, unpublish_id, published)
    log.info("%s: the publish of branch %s undone at snapshot %s", identifier, branch, done)
    return _report(table, recorded, "unpublish", done, started)


def _report(
    table: IcebergTable,
    correction: Correction,
    action: str,
    snapshot_id: int | None,
    started: float,
    already: bool = False,
) -> Published:
    removed = added = files_removed = files_added = 0
    if snapshot_id is not None:
        summary = table.table.snapshot(snapshot_id).summary()

        def number(key: str) -> int:
            value = summary.get(key)
            return int(value) if value is not None else 0

        removed, added = number("deleted-records"), number("added-records")
        files_removed, files_added = number("deleted-data-files"), number("added-data-files")
    return Published(
        table=table.identifier, branch=correction.branch, window=correction.replaced_window, action=action,
        snapshot=snapshot_id or -1, tag=correction.tag, files_removed=files_removed, files_added=files_added,
        rows_removed=removed, rows_added=added, seconds=time.monotonic() - started, already=already,
    )  # fmt: skip
