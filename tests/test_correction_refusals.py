"""A correction's settings and commands: the read window follows from the window corrected, and every bad
input is refused before Spark starts, naming what to fix."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

from bergstream.backfill.errors import BackfillConfigError
from bergstream.runtime.checkpoint_names import backfill_checkpoint
from bergstream.runtime.correct.identity import identity_of
from bergstream.runtime.correct.state import Correction, property_name, recorded
from bergstream.runtime.settings import correction, load_app_settings
from tests.commands import refused_before_spark
from tests.services import Services
from tests.test_backfill_settings import DEFAULTS
from tests.test_backfill_settings import write as settings_file

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROOT = Path(__file__).parent.parent
OUTPUT = {
    "time_column": "session_start",
    "end_column": "session_end",
    "key": ["account_id", "session_start"],
    "warm_up": "1h",
    "settle": "2h",
}
START, END = datetime(2026, 11, 20, tzinfo=UTC), datetime(2026, 11, 20, 6, tzinfo=UTC)
SCHEMA = pa.schema([("account_id", pa.int64()), ("session_start", pa.timestamp("us", tz="UTC")),
                    ("session_end", pa.timestamp("us", tz="UTC")), ("events", pa.int64())])  # fmt: skip


def output_with_branch(
    stack: Services, name: str, starts: list[datetime], **progress: Any
) -> tuple[Any, Correction]:
    """An output table of sessions starting at `starts`, and a correction of [START, END) in its branch
    `fix` made from it, as far as `progress` says."""
    catalog = stack.catalog.load()
    catalog.create_namespace_if_not_exists("apps")
    table = catalog.create_table(("apps", name), schema=SCHEMA)
    rows = {
        "account_id": list(range(len(starts))),
        "session_start": starts,
        "session_end": [start + timedelta(minutes=30) for start in starts],
        "events": [3] * len(starts),
    }
    table.append(pa.table(rows, schema=SCHEMA))
    base = table.current_snapshot()
    assert base is not None
    table.manage_snapshots().create_branch(base.snapshot_id, "fix").commit()
    known = Correction(app="sessionizer", branch="fix", time_column="session_start",
                       key=("account_id", "session_start"), start=START, end=END, base=base.snapshot_id,
                       end_column="session_end", **progress)  # fmt: skip
    with table.transaction() as transaction:
        transaction.set_properties({property_name("fix"): known.dumps()})
    return table, known


def backfill(path: Path) -> Any:
    overrides = {"mode": "backfill", "backfill": {"start": START, "end": END}}
    return load_app_settings("sessionizer", path, defaults=DEFAULTS, overrides=overrides)


def test_a_correction_reads_its_warm_up_before_the_window_and_its_settle_after_it(tmp_path: Path) -> None:
    plain = backfill(settings_file(tmp_path, output=OUTPUT))
    corrected = correction(plain, "fix")
    assert (corrected.backfill.start, corrected.backfill.end) == (
        START - timedelta(hours=1),
        END + timedelta(hours=2),
    )
    correct = corrected.backfill.correct
    assert correct is not None and (correct.branch, correct.start, correct.end) == ("fix", START, END)
    # Another branch is another backfill, never resumed from this one's checkpoint.
    assert backfill_checkpoint(corrected) != backfill_checkpoint(correction(plain, "other"))
    assert backfill_checkpoint(corrected) != backfill_checkpoint(plain)


def test_a_correction_without_the_output_s_settings_is_refused_naming_each(tmp_path: Path) -> None:
    plain = backfill(settings_file(tmp_path, output={"time_column": "session_start"}))
    with pytest.raises(BackfillConfigError) as refused:
        correction(plain, "fix")
    message = str(refused.value)
    assert "output.key" in message and "output.warm_up" in message and "output.settle" in message
    assert "output.end_column" in message
    assert "output.time_column" not in message
    with pytest.raises(BackfillConfigError, match=r"output\.key"):
        backfill(settings_file(tmp_path, output={**OUTPUT, "key": []}))
    with pytest.raises(BackfillConfigError, match="branch"):
        correction(backfill(settings_file(tmp_path, output=OUTPUT)), "fix-me")


def test_a_correction_s_checkpoint_is_its_run_s_own(tmp_path: Path) -> None:
    """A branch made again under the same name (released, or started over) never resumes an earlier run's
    query: its checkpoint is named from its run."""
    plain = backfill(settings_file(tmp_path, output=OUTPUT))
    first = backfill_checkpoint(correction(plain, "fix", run="20261120T000000000000"))
    again = backfill_checkpoint(correction(plain, "fix", run="20261120T000001000000"))
    assert first != again and first.endswith("_branch-fix_run-20261120T000000000000")


def test_a_correction_s_record_reads_back_as_written(tmp_path: Path) -> None:
    written = Correction(app="a", branch="fix", time_column="t", key=("k", "t"), start=START, end=END, base=7,
                         cleared=True, publish_id="p", tag="fix-before-p")  # fmt: skip
    assert recorded({property_name("fix"): written.dumps()}, "fix") == written
    ended = written.but(complete=True, watermark=END + timedelta(minutes=50), watermarked=False)
    assert recorded({property_name("fix"): ended.dumps()}, "fix") == ended
    plain = backfill(settings_file(tmp_path, output=OUTPUT, options={"gap": "30 minutes"}))
    named = correction(plain, "fix", run="20261120T000000000000")
    identified = written.but(identity=identity_of(named))
    assert recorded({property_name("fix"): identified.dumps()}, "fix") == identified
    assert recorded({}, "fix") is None
    assert written.published and not written.but(unpublish_id="u").published
    assert written.window_sql() == (
        "(`t` >= TIMESTAMP '2026-11-20T00:00:00+00:00' AND `t` < TIMESTAMP '2026-11-20T06:00:00+00:00')"
    )
    # Widened to the spans that cross its edges: what a publish replaces.
    widened = written.but(end_column="e", edge_start=START - timedelta(minutes=40),
                          edge_end=END + timedelta(hours=1), edge_groups=3)  # fmt: skip
    assert recorded({property_name("fix"): widened.dumps()}, "fix") == widened
    assert widened.replaced_window == "[2026-11-19T23:20:00Z, 2026-11-20T07:00:00Z)"
    assert written.replaced == (START, END)


@pytest.mark.integration
def test_bad_corrections_are_refused_before_spark_starts_naming_what_to_fix(
    stack: Services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"refusals_{tmp_path.name}"[:60]
    output_with_branch(stack, name, [START])
    common = {"catalog": stack.catalog.model_dump(mode="json", exclude_none=True),
              "checkpoint_location": str(tmp_path / "checkpoint"),
              "kafka": {"kafka.bootstrap.servers": stack.bootstrap_servers}}  # fmt: skip

    def refused(*arguments: str, **settings: Any) -> str:
        path = settings_file(
            tmp_path, **{"output_table": f"apps.{name}", "output": OUTPUT, **common, **settings}
        )
        command = ["backfill", *arguments, "--app", "sessionizer", "--config", str(path)]
        return refused_before_spark(monkeypatch, *command).message

    window = ["--start", START.isoformat(), "--end", END.isoformat()]
    assert "output.time_column" in refused("run", *window, "--branch", "fix", output={})
    assert "not in the Iceberg catalog" in refused("run", *window, "--branch", "fix",
                                                   output_table="spark_catalog.default.sessions")  # fmt: skip
    assert "no output table bergstream.apps.no_such" in refused("run", *window, "--branch", "fix",
                                                                 output_table="apps.no_such")  # fmt: skip
    other = ["--start", START.isoformat(), "--end", (END + timedelta(hours=1)).isoformat()]
    mismatch = refused("run", *other, "--branch", "fix")
    assert "corrects sessionizer's window [2026-11-20T00:00:00Z, 2026-11-20T06:00:00Z)" in mismatch
    assert "add --start-over to correct this window in it instead" in mismatch
    # Recorded by a bergstream that kept no run: resumed by none, started over only.
    unnamed = refused("run", *window, "--branch", "fix")
    assert "did not record the settings its rows were computed with" in unnamed
    assert "a correction replaces every region's rows" in refused("run", *window, "--branch", "fix",
                                                                  "--region", "eu")  # fmt: skip
    assert "output.time_column 'session_stop' is not a column" in refused(
        "run", *window, "--branch", "other", output={**OUTPUT, "time_column": "session_stop"})  # fmt: skip
    assert "output.end_column 'session_stop' is not a column" in refused(
        "run", *window, "--branch", "other", output={**OUTPUT, "end_column": "session_stop"})  # fmt: skip
    assert "output.end_column 'events' of" in refused(
        "run", *window, "--branch", "other", output={**OUTPUT, "end_column": "events"})  # fmt: skip
    assert "is a long, not a timestamp" in refused("run", *window, "--branch", "other",
                                                   output={**OUTPUT, "time_column": "events"})  # fmt: skip
    assert "output.key names window_id" in refused("run", *window, "--branch", "other",
                                                   output={**OUTPUT, "key": ["window_id"]})  # fmt: skip
    # The archive must hold the events the window's rows need: its table does not even exist here.
    assert "playback" in refused("run", *window, "--branch", "other")
    for command in ("audit", "publish", "unpublish"):
        unknown = refused(command, "--branch", "nope")
        assert "has no correction in branch nope (its corrections: fix)" in unknown, unknown
    assert "has no correction in branch nope: nothing to release" in refused("release", "--branch", "nope")
    # Every command on a correction takes its output table as a flag too, over the file's.
    for command in ("audit", "publish", "unpublish", "verify", "release"):
        elsewhere = refused(command, "--branch", "fix", "--output-table", "apps.no_such")
        assert "no output table bergstream.apps.no_such" in elsewhere, (command, elsewhere)
    # A backfill that has not covered its window is neither audited nor published.
    assert "has not covered its window yet" in refused("publish", "--branch", "fix")
    # Nor one whose application's watermark ended before the window's end: rows ending past it are missing.
    short = f"{name}_short"[:60]
    output_with_branch(stack, short, [START], cleared=True, complete=True,
                       watermark=END - timedelta(minutes=30))  # fmt: skip
    early = refused("publish", "--branch", "fix", output_table=f"apps.{short}")
    assert "ended with the application's watermark at 2026-11-20T05:30:00Z, before the window's end " \
           "2026-11-20T06:00:00Z" in early, early  # fmt: skip
    assert "output.settle (now 2h)" in early and "backfill release --app sessionizer --branch fix" in early
    # Nor one whose watermark is not known (a run killed after its last batch, before recording it).
    unknown = f"{name}_unknown"[:60]
    output_with_branch(stack, unknown, [START], cleared=True, complete=True, watermark=None)
    assert "recorded no event-time watermark" in refused("publish", "--branch", "fix",
                                                         output_table=f"apps.{unknown}")  # fmt: skip


@pytest.mark.integration
def test_a_correction_run_again_with_other_settings_is_refused_naming_each_before_spark_starts(
    stack: Services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its branch holds rows computed with the recorded settings: appended to by a run with others, it would
    hold a row twice, or rows of two computations."""
    name = f"identity_{tmp_path.name}"[:60]
    common = {"catalog": stack.catalog.model_dump(mode="json", exclude_none=True), "output": OUTPUT,
              "checkpoint_location": str(tmp_path / "checkpoint"), "output_table": f"apps.{name}",
              "options": {"gap": "30 minutes"}, "backfill": {"max_misalignment": "15m"},
              "kafka": {"kafka.bootstrap.servers": stack.bootstrap_servers}}  # fmt: skip
    path = settings_file(tmp_path, **common)
    plain = backfill(path)
    named = correction(plain.model_copy(update={"catalog": stack.catalog}), "fix", run="20261120T000000")
    run = named.model_copy(update={"checkpoint_location": backfill_checkpoint(named)})
    assert "run-20261120T000000" in run.checkpoint_location
    output_with_branch(stack, name, [START], cleared=True, identity=identity_of(run))

    def refused(*arguments: str, **settings: Any) -> str:
        changed = settings_file(tmp_path, **{**common, **settings})
        message = refused_before_spark(
            monkeypatch, "backfill", "run", "--app", "sessionizer", "--config", str(changed),
            "--start", START.isoformat(), "--end", END.isoformat(), "--branch", "fix", *arguments,
        ).message  # fmt: skip
        assert "holds rows computed with other settings than these" in message, message
        assert "--start-over" in message
        return message

    settle = refused(output={**OUTPUT, "settle": "3h"})
    assert "the read window's end (the window's end plus output.settle): 2026-11-20T08:00:00Z recorded, " \
           "2026-11-20T09:00:00Z now" in settle, settle  # fmt: skip
    assert "output.warm_up" in refused(output={**OUTPUT, "warm_up": "2h"})
    assert "the order (--max-misalignment, --strict, --unordered): 15m recorded, 5m now" in refused(
        "--max-misalignment", "5m"
    )
    assert "15m recorded, strict now" in refused("--strict")
    assert "options: gap '30 minutes' recorded, '45 minutes' now" in refused(options={"gap": "45 minutes"})
    assert "entry: bergstream.apps.sessionizer:sessionizer recorded" in refused(
        entry="bergstream.apps.attribution:attribution"
    )
    assert "--checkpoint" in refused("--checkpoint", str(tmp_path / "elsewhere"))
    # The same settings get past these checks to the archive's (which does not exist here): a resume.
    same = refused_before_spark(
        monkeypatch, "backfill", "run", "--app", "sessionizer", "--config", str(path),
        "--start", START.isoformat(), "--end", END.isoformat(), "--branch", "fix",
    )  # fmt: skip
    assert "no archive table" in same.message, same.message


@pytest.mark.integration
def test_a_publish_is_refused_when_main_wrote_into_the_window_after_the_branch_was_made(
    stack: Services, tmp_path: Path
) -> None:
    name = f"conflict_{tmp_path.name}"[:60]
    table, known = output_with_branch(
        stack,
        name,
        [START, END + timedelta(hours=1)],
        cleared=True,
        complete=True,
        watermark=END + timedelta(hours=1),
    )
    # A row of the window written into main after the branch was made.
    late_row = {
        "account_id": [5],
        "session_start": [START + timedelta(hours=1)],
        "session_end": [START + timedelta(hours=1, minutes=30)],
        "events": [1],
    }
    table.append(pa.table(late_row, schema=SCHEMA))
    late = table.current_snapshot()
    assert late is not None
    path = settings_file(tmp_path, output_table=f"apps.{name}", output=OUTPUT,
                         catalog=stack.catalog.model_dump(mode="json", exclude_none=True),
                         checkpoint_location=str(tmp_path / "checkpoint"),
                         kafka={"kafka.bootstrap.servers": stack.bootstrap_servers})  # fmt: skip
    ran = subprocess.run([sys.executable, "-m", "bergstream", "backfill", "publish", "--app", "sessionizer",
                          "--branch", "fix", "--config", str(path), "--no-live-query"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert ran.returncode != 0
    assert "main changed the window [2026-11-20T00:00:00Z, 2026-11-20T06:00:00Z)" in ran.stderr, ran.stderr[
        -2000:
    ]
    assert f"snapshot {late.snapshot_id} (append" in ran.stderr and "--start-over" in ran.stderr
    table = stack.catalog.load().load_table(("apps", name))
    current = table.current_snapshot()
    assert current is not None and current.snapshot_id == late.snapshot_id, "main changed"
    assert sorted(table.metadata.refs) == ["fix", "main"], "a tag was made"
    assert recorded(dict(table.properties), "fix") == known


def test_an_output_table_bergstream_makes_is_partitioned_by_the_hour_of_its_time_column(
    stack: Services, spark: SparkSession
) -> None:
    """Its windows then hold whole files: a correction's branch is cleared of one without rewriting any."""
    from bergstream.runtime.app import OUTPUT_PROPERTIES, make_output_table

    catalog = stack.catalog.load()
    catalog.create_namespace_if_not_exists("apps")
    frame = spark.createDataFrame(
        [(1, datetime(2026, 11, 20, 1, 30), 3)], "account_id bigint, session_start timestamp, events bigint"
    )
    prefix = f"{stack.catalog.name}.apps"
    make_output_table(spark, "sessionizer", f"{prefix}.made_hourly", frame, "session_start")
    table = catalog.load_table(("apps", "made_hourly"))
    source = table.schema().find_field("session_start").field_id
    assert [(str(field.transform), field.source_id) for field in table.spec().fields] == [("hour", source)]
    assert OUTPUT_PROPERTIES.items() <= dict(table.properties).items()
    # A table that exists is left as it is: made again, or made by its user.
    make_output_table(spark, "sessionizer", f"{prefix}.made_hourly", frame, "session_start")
    assert catalog.load_table(("apps", "made_hourly")).metadata == table.metadata
    catalog.create_table(("apps", "made_by_user"), schema=SCHEMA)
    make_output_table(spark, "sessionizer", f"{prefix}.made_by_user", frame, "session_start")
    assert catalog.load_table(("apps", "made_by_user")).spec().is_unpartitioned()
    # A time column the output lacks, or not a timestamp: refused naming it, nothing made.
    for column, found in (("events", "bigint"), ("session_end", "none")):
        with pytest.raises(BackfillConfigError) as refused:
            make_output_table(spark, "sessionizer", f"{prefix}.made_other", frame, column)
        assert f"output.time_column {column!r} is not a timestamp column" in str(refused.value)
        assert f"its type: {found}; its columns: account_id, session_start, events" in str(refused.value)
    assert not catalog.table_exists(("apps", "made_other"))
