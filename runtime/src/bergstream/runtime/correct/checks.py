"""What is refused before Spark starts, naming what to fix: a correction's output table that is not an
Iceberg table of the catalog or lacks its time column or key, a branch that is unknown or holds another
window, an archive that does not hold the events the window's rows need yet."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from bergstream.backfill.errors import BackfillConfigError
from bergstream.runtime.app import output_identifier
from bergstream.runtime.checkpoint_names import backfill_checkpoint
from bergstream.runtime.correct.archived import check_archived_to
from bergstream.runtime.correct.identity import differences, identity_of, new_run
from bergstream.runtime.correct.state import Correction, property_name, recorded
from bergstream.runtime.settings import AppSettings
from bergstream.timeparse import format_duration, format_instant

if TYPE_CHECKING:
    from pyiceberg.table import Table

# The row-level modes a correction's rewrite of the window needs: copy-on-write, Iceberg's default.
_ROW_LEVEL_MODES = ("write.delete.mode", "write.update.mode", "write.merge.mode")


@dataclass(frozen=True)
class OutputTable:
    """The application's output table, as pyiceberg reads it: no Spark needed."""

    identifier: str  # catalog.namespace.table, for Spark
    table: Table

    @property
    def properties(self) -> dict[str, str]:
        return dict(self.table.properties)

    def branch_snapshot(self, branch: str) -> int | None:
        ref = self.table.metadata.refs.get(branch)
        return None if ref is None or str(ref.snapshot_ref_type) != "branch" else int(ref.snapshot_id)


def output_table(settings: AppSettings) -> OutputTable:
    """The application's output table, or an error naming what to fix."""
    from pyiceberg.exceptions import NoSuchTableError

    identifier = output_identifier(settings)
    catalog_name, namespace, name = identifier.split(".")
    if catalog_name != settings.catalog.name:
        raise BackfillConfigError(
            f"{settings.app}: output table {identifier} is not in the Iceberg catalog "
            f"{settings.catalog.name}: a correction writes a branch of an Iceberg table; set output_table "
            "to one of that catalog"
        )
    try:
        table = settings.catalog.load().load_table((namespace, name))
    except NoSuchTableError as error:
        raise BackfillConfigError(
            f"{settings.app}: no output table {identifier}: a correction replaces rows of an existing "
            "output; run the application (or `backfill run` without --branch) to make it first"
        ) from error
    return OutputTable(identifier, table)


def check_output_columns(settings: AppSettings, output: OutputTable) -> None:
    """The output's time and end columns are timestamps of one type and its key's columns exist."""
    fields = {field.name: field for field in output.table.schema().fields}
    time_column, end_column = settings.output.time_column, settings.output.end_column
    assert time_column is not None and end_column is not None and settings.output.key is not None, (
        "validated by AppSettings"
    )
    for name, column in (("time_column", time_column), ("end_column", end_column)):
        found = fields.get(column)
        if found is None:
            raise BackfillConfigError(
                f"{settings.app}: output.{name} {column!r} is not a column of {output.identifier} "
                f"(its columns: {', '.join(fields)})"
            )
        if str(found.field_type) != str(fields[time_column].field_type) or str(found.field_type) not in (
            "timestamp", "timestamptz"
        ):  # fmt: skip
            raise BackfillConfigError(
                f"{settings.app}: output.{name} {column!r} of {output.identifier} is a "
                f"{found.field_type}, not a timestamp of the time column's type "
                f"({fields[time_column].field_type})"
            )
    missing = [column for column in settings.output.key if column not in fields]
    if missing:
        raise BackfillConfigError(
            f"{settings.app}: output.key names {', '.join(missing)}, not columns of {output.identifier} "
            f"(its columns: {', '.join(fields)})"
        )
    merge_on_read = [name for name in _ROW_LEVEL_MODES if output.properties.get(name) == "merge-on-read"]
    if merge_on_read:
        raise BackfillConfigError(
            f"{settings.app}: {output.identifier} sets {', '.join(merge_on_read)} merge-on-read: a "
            "correction replaces whole files (copy-on-write); unset it, or set copy-on-write"
        )


def check_new_correction(settings: AppSettings, checkpoint: str | None = None) -> AppSettings:
    """`backfill run --branch`: the output table can be corrected, the branch is new, or holds this window
    computed with these settings (then resumed), or is to start over; the archive holds every event the
    window's rows need. The settings of the run: its run named, its checkpoint chosen (`checkpoint`, when
    given; the recorded one, when resumed; else one named from the run)."""
    correct = settings.backfill.correct
    assert correct is not None
    output = output_table(settings)
    check_output_columns(settings, output)
    known = recorded(output.properties, correct.branch)
    resumed = known is not None and not correct.start_over
    if output.branch_snapshot(correct.branch) is not None or known is not None:
        if known is None:
            raise BackfillConfigError(
                f"{settings.app}: {output.identifier} has a branch {correct.branch} that is not a "
                "correction's: name another branch"
            )
        if known.published:
            raise BackfillConfigError(
                f"{settings.app}: branch {correct.branch} of {output.identifier} is published: "
                "`backfill unpublish` it first, or name another branch"
            )
        other_window = (known.start, known.end) != (correct.start, correct.end)
        if resumed and (other_window or known.app != settings.app):
            raise BackfillConfigError(
                f"{settings.app}: branch {correct.branch} of {output.identifier} corrects {known.app}'s "
                f"window {known.window}, not "
                f"[{format_instant(correct.start)}, {format_instant(correct.end)}): "
                f"give that window to resume it, add --start-over to correct this window in it instead, or "
                "name another branch"
            )
    elif output.table.current_snapshot() is None:
        raise BackfillConfigError(
            f"{settings.app}: {output.identifier} has no rows yet: there is nothing to correct; run "
            "`backfill run` without --branch"
        )
    run = run_settings(settings, known if resumed else None, checkpoint)
    assert settings.backfill.end is not None
    check_archived_to(settings, settings.backfill.end)
    return run


def run_settings(settings: AppSettings, resumed: Correction | None, checkpoint: str | None) -> AppSettings:
    """The settings of the correction's run: the `resumed` correction's run, refused when these settings
    would compute its rows otherwise; else a new run, with a checkpoint of its own."""
    correct = settings.backfill.correct
    assert correct is not None
    if resumed is None:
        named = settings.model_copy(update={"backfill": settings.backfill.model_copy(
            update={"correct": correct.model_copy(update={"run": new_run()})})})  # fmt: skip
        return named.model_copy(update={"checkpoint_location": checkpoint or backfill_checkpoint(named)})
    again = f"`backfill run --app {settings.app} --branch {correct.branch} --start-over`"
    if resumed.identity is None:
        raise BackfillConfigError(
            f"{settings.app}: branch {correct.branch} was written by an earlier bergstream that did not "
            f"record the settings its rows were computed with: start it over ({again} with the window)"
        )
    named = settings.model_copy(update={"backfill": settings.backfill.model_copy(
        update={"correct": correct.model_copy(update={"run": resumed.identity.run})})})  # fmt: skip
    named = named.model_copy(update={"checkpoint_location": checkpoint or resumed.identity.checkpoint})
    changed = differences(resumed.identity, identity_of(named), checkpoint_given=checkpoint is not None)
    if resumed.end_column != settings.output.end_column:
        changed.append(f"output.end_column: {resumed.end_column or 'none'} recorded, "
                       f"{settings.output.end_column} now")  # fmt: skip
    if changed:
        raise BackfillConfigError(
            f"{settings.app}: branch {correct.branch} holds rows computed with other settings than these: "
            f"{'; '.join(changed)}. Nothing was written. Give the recorded settings to resume it, or start "
            f"it over with these ({again}: its rows removed, its run released)"
        )
    return named


def recorded_correction(
    settings: AppSettings, branch: str, complete: bool = True, publishing: bool = False
) -> tuple[OutputTable, Correction]:
    """The correction of `branch` (audit, publish, unpublish), its backfill `complete` unless said otherwise,
    and when `publishing` its rows of the window complete to its end; or an error naming what to fix."""
    output = output_table(settings)
    known = recorded(output.properties, branch)
    if known is None or output.branch_snapshot(branch) is None:
        others = sorted(
            name[len(property_name("")) :] for name in output.properties if name.startswith(property_name(""))
        )
        raise BackfillConfigError(
            f"{settings.app}: {output.identifier} has no correction in branch {branch} "
            f"(its corrections: {', '.join(others) or 'none'}); `backfill run --branch {branch}` makes one"
        )
    if complete and not known.complete:
        raise BackfillConfigError(
            f"{settings.app}: the backfill into branch {branch} of {output.identifier} has not covered its "
            f"window yet: run `backfill run --app {known.app} --branch {branch}` with its window "
            f"{known.window} again to finish it"
        )
    if publishing and known.watermarked and known.watermark is None:
        raise BackfillConfigError(
            f"{settings.app}: the backfill into branch {branch} of {output.identifier} recorded no "
            "event-time watermark of the application, whose query sets one: its rows of the window cannot "
            f"be shown complete, and a publish could remove main's. Run `backfill run --app {known.app} "
            f"--branch {branch}` with its window {known.window} again to record it"
        )
    if publishing and known.watermark is not None and known.watermark < known.end:
        settle = format_duration(settings.output.settle) if settings.output.settle is not None else "unset"
        raise BackfillConfigError(
            f"{settings.app}: the backfill into branch {branch} of {output.identifier} ended with the "
            f"application's watermark at {format_instant(known.watermark)}, before the window's end "
            f"{format_instant(known.end)}: its rows of the window that end after the watermark were never "
            f"written, and a publish would remove main's. Set output.settle (now {settle}) to at least the "
            f"application's watermark delay plus a row's longest span, then `backfill release --app "
            f"{known.app} --branch {branch}` and run the correction again"
        )
    if publishing and known.end_column is None:
        raise BackfillConfigError(
            f"{settings.app}: branch {branch} of {output.identifier} was written by an earlier bergstream "
            "that did not follow the rows that cross its window's edges: a publish could count their events "
            "twice or in no row. Nothing was changed; start it over (`backfill run --app "
            f"{known.app} --branch {branch} --start-over` with its window {known.window})"
        )
    if publishing and known.edge_refusal is not None:
        raise BackfillConfigError(
            f"{settings.app}: branch {branch} of {output.identifier} cannot replace whole the rows that "
            f"cross its window {known.window}'s edges (widened to {known.replaced_window}): "
            f"{known.edge_refusal}, "
            f"with `backfill run --app {known.app} --branch {branch} --start-over` and its window. Nothing "
            "was changed"
        )
    return output, known
