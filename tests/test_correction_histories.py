"""A correction after the histories an operator runs on a bad day: run again with other settings, released
and made again under the same name, killed after its last batch, its checkpoint lost. Each ends with main's
window the sessions computed here from every archived event, each once, or with a refusal that changes
nothing; never with rows doubled, emptied or short and an exit of 0.

The commands run as the command line runs them (settings loaded from the application's file, checked before
Spark, then run), in this process's Spark session: the kills that need a process of their own are in
tests/corrections.py.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from bergstream.backfill.errors import BackfillConfigError, BackfillError
from bergstream.runtime.checkpoint import CheckpointFiles, committed_watermark
from bergstream.runtime.correct import branch as branch_module
from bergstream.runtime.correct import publish as publish_module
from bergstream.runtime.correct import release as release_module
from bergstream.runtime.correct import writer
from bergstream.runtime.correct.audit import audit
from bergstream.runtime.correct.branch import HOLD_MS, IcebergTable, make_branch
from bergstream.runtime.correct.checks import check_new_correction, recorded_correction
from bergstream.runtime.correct.publish import Conflict, HistoryExpired, publish, unpublish
from bergstream.runtime.correct.release import release
from bergstream.runtime.correct.state import Correction
from bergstream.runtime.correct.verify import verify
from bergstream.runtime.run import run_app
from bergstream.runtime.run_report import RunReport
from bergstream.runtime.settings import AppSettings, correction, load_app_settings
from tests import corrections
from tests.corrections import Killed, Row, Scenario, killed, table_rows
from tests.services import Services

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration
OUTPUT = {
    "time_column": "session_start", "end_column": "session_end", "key": ["account_id", "session_start"],
    "warm_up": "1h", "settle": "3h",
}  # fmt: skip


class Operator:
    """The correction commands over the sessionizer's output of a late partition's topic, as an operator
    gives them; main made by the live application reading the topic once."""

    def __init__(
        self,
        stack: Services,
        spark: SparkSession,
        home: Path,
        scenario: Scenario,
        window: tuple[datetime, datetime] | None = None,
        live_topic: str | None = None,
    ) -> None:
        """The live application reads `live_topic` (by default the archived topic) for the scenario's first
        source, its archived topics for the others, into main."""
        self.stack, self.spark, self.home, self.scenario = stack, spark, home, scenario
        self.live_topic = live_topic
        self.output = f"histories_{next(iter(scenario.topics.values()))}"
        self.identifier = f"{stack.catalog.name}.apps.{self.output}"
        self.window = window or (scenario.start, scenario.start + timedelta(hours=1))
        self.in_window = scenario.in_window(*self.window)
        self.output_settings = {
            "time_column": scenario.time_column,
            "key": list(scenario.key),
            **scenario.output,
        }
        live = self.settings(mode="live")
        run_app(spark, live, available_now=True, show_progress=False)
        self.live_snapshot = IcebergTable(spark, self.identifier).table.currentSnapshot().snapshotId()

    def settings(self, output: dict[str, Any] | None = None, **flags: Any) -> AppSettings:
        app, first = self.scenario.app, next(iter(self.scenario.topics))
        sources = {
            kind: {"topic": self.live_topic if kind == first and self.live_topic else topic, "table": topic,
                   "schema": kind}
            for kind, topic in self.scenario.topics.items()
        }  # fmt: skip
        path = self.home / f"{app}.yaml"
        path.write_text(yaml.safe_dump({
            "app": app, "entry": f"bergstream.apps.{app}:{app}", "sources": sources,
            "kafka": {"kafka.bootstrap.servers": self.stack.bootstrap_servers, "startingOffsets": "earliest"},
            "catalog": self.stack.catalog.model_dump(mode="json", exclude_none=True),
            "checkpoint_location": str(self.home / "live"), "max_offsets_per_trigger": 300 * len(sources),
            "output_table": f"apps.{self.output}", "backfill": {"max_misalignment": "30m"},
            "output": output or self.output_settings, "options": self.scenario.options,
        }))  # fmt: skip
        return load_app_settings(app, path, defaults={}, overrides=flags)

    def checked(
        self, branch: str, start_over: bool = False, output: dict[str, Any] | None = None, **backfill: Any
    ) -> AppSettings:
        """`backfill run --branch`'s checks before Spark: the run's settings, or BackfillConfigError."""
        start, end = (instant.isoformat() for instant in self.window)
        plain = self.settings(output, mode="backfill", backfill={"start": start, "end": end, **backfill})
        return check_new_correction(correction(plain, branch, start_over=start_over))

    def run(
        self, branch: str, start_over: bool = False, output: dict[str, Any] | None = None, **backfill: Any
    ) -> RunReport:
        """`backfill run --branch`: checked before Spark, then run."""
        settings = self.checked(branch, start_over, output, **backfill)
        report = run_app(self.spark, settings, show_progress=False)
        assert report.complete, report.problems
        return report

    def run_killed_after_last_batch(
        self, branch: str, monkeypatch: pytest.MonkeyPatch, output: dict[str, Any] | None = None
    ) -> None:
        """`backfill run --branch` killed after the query's last batch, before the run's rows reach the
        branch and the record says complete: its run's table holds every batch."""
        with monkeypatch.context() as patched:
            patched.setattr(writer, "copy_window", killed)
            with pytest.raises(Killed):
                self.run(branch, output=output)
        assert not self.recorded(branch).complete

    def recorded_or_none(self, branch: str) -> Correction | None:
        return IcebergTable(self.spark, self.identifier).correction(branch)

    def recorded(self, branch: str) -> Correction:
        found = self.recorded_or_none(branch)
        assert found is not None
        return found

    def publish(self, branch: str) -> None:
        """`backfill publish`: its checks before Spark, then the publish."""
        recorded_correction(self.settings(), branch, publishing=True)
        publish(self.spark, self.identifier, branch, str(self.home / "live"))

    def release(self, branch: str) -> list[str]:
        return release(self.spark, self.stack.catalog, self.identifier, branch)

    def assert_kept_beyond(self, branch: str) -> None:
        """Main outside the window widened to the rows that cross its edges holds the live query's rows, and
        beside the window, within it, the branch's."""
        correction = self.recorded(branch)
        widened = self.scenario.in_window(*correction.replaced)
        live = table_rows(self.spark, self.scenario, self.identifier, f"NOT ({widened})", self.live_snapshot)
        assert self.rows(f"NOT ({widened})") == live
        beside = f"({widened}) AND NOT ({self.in_window})"
        assert self.rows(beside) == self.rows(beside, f"{self.identifier}.branch_{branch}")

    def rows(self, where: str, table: str | None = None) -> Counter[Row]:
        return table_rows(self.spark, self.scenario, table or self.identifier, where)

    def branch_rows(self, branch: str) -> Counter[Row]:
        return self.rows(self.in_window, f"{self.identifier}.branch_{branch}")

    @property
    def expected(self) -> Counter[Row]:
        return self.scenario.expected(*self.window)


@pytest.fixture(scope="module")
def operator(stack: Services, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Operator:
    home = tmp_path_factory.mktemp("histories")
    return Operator(stack, spark, home, corrections.late_plays(stack, spark, home, name="history_plays"))


def test_a_correction_run_again_with_other_settings_is_refused_then_started_over_each_row_once(
    operator: Operator,
) -> None:
    operator.run("fix")
    assert operator.branch_rows("fix") == operator.expected
    first = operator.recorded("fix")
    assert first.identity is not None
    # The operator lengthens output.settle (as a publish refusal advises) and runs the same branch again.
    longer = {**OUTPUT, "settle": "210m"}
    with pytest.raises(BackfillConfigError, match=r"output\.settle\): .* recorded, .* now"):
        operator.run("fix", output=longer)
    with pytest.raises(BackfillConfigError, match="the order"):
        operator.run("fix", max_misalignment="20m")
    assert operator.branch_rows("fix") == operator.expected, "a refused run wrote into the branch"
    assert operator.recorded("fix") == first

    # Started over with the new settings: the branch holds the window's rows once, the first run's
    # checkpoint is gone.
    operator.run("fix", start_over=True, output=longer)
    again = operator.recorded("fix")
    assert again.identity is not None and again.identity.run != first.identity.run
    assert again.identity.read_end == first.identity.read_end + timedelta(minutes=30)
    assert not Path(first.identity.checkpoint).exists()
    assert operator.branch_rows("fix") == operator.expected
    assert audit(operator.spark, operator.identifier, again).duplicated == 0
    operator.publish("fix")
    assert operator.rows(operator.in_window) == operator.expected
    operator.assert_kept_beyond("fix")


def test_a_correction_released_and_made_again_under_the_same_name_reads_its_window_again(
    operator: Operator,
) -> None:
    operator.run("again")
    first = operator.recorded("again")
    assert first.identity is not None
    removed = operator.release("again")
    assert f"the checkpoint {first.identity.checkpoint}" in removed, removed
    assert not Path(first.identity.checkpoint).exists()
    # The same command again: a new run with a checkpoint of its own, that reads the whole window.
    operator.run("again")
    made = operator.recorded("again")
    assert made.identity is not None and made.identity.checkpoint != first.identity.checkpoint
    assert operator.branch_rows("again") == operator.expected
    operator.publish("again")
    assert operator.rows(operator.in_window) == operator.expected
    operator.assert_kept_beyond("again")


def test_a_release_killed_after_its_commit_leaves_nothing_the_same_name_picks_up_again(
    operator: Operator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run killed after its last batch (its run's table full), then a release (as `--start-over` runs one)
    killed once its branch, tags and record are gone, before the run's table, checkpoint and pins: the same
    name again is a new run that reads the whole window, its rows once."""
    operator.run_killed_after_last_batch("halfway", monkeypatch)
    first = operator.recorded("halfway")
    assert first.identity is not None
    with monkeypatch.context() as patched:
        patched.setattr(release_module, "drop_staging", killed)
        with pytest.raises(Killed):
            operator.release("halfway")
    assert operator.recorded_or_none("halfway") is None
    assert Path(first.identity.checkpoint).exists(), "left by the kill"
    operator.run("halfway")
    again = operator.recorded("halfway")
    assert again.identity is not None and again.identity.run != first.identity.run
    assert operator.branch_rows("halfway") == operator.expected
    assert audit(operator.spark, operator.identifier, again).duplicated == 0
    assert (
        not Path(first.identity.checkpoint).exists() or again.identity.checkpoint != first.identity.checkpoint
    )


def test_a_run_killed_after_its_last_batch_records_its_watermark_when_run_again(
    operator: Operator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run again, it reads nothing: the watermark comes from its checkpoint, and a settle too short for the
    window's rows to be complete is refused at the publish all the same."""
    short = {**OUTPUT, "settle": "30m"}
    # Killed after the query's last batch, before the run's rows reached the branch and the record.
    operator.run_killed_after_last_batch("short", monkeypatch, output=short)
    with pytest.raises(BackfillConfigError, match="has not covered its window yet"):
        operator.publish("short")
    operator.run("short", output=short)
    ended = operator.recorded("short")
    assert ended.identity is not None and ended.watermarked and ended.watermark is not None
    files = CheckpointFiles(operator.spark, ended.identity.checkpoint)
    millis = committed_watermark(files)
    assert millis is not None and ended.watermark.timestamp() * 1000 == millis
    assert ended.watermark < ended.end, "a settle of 30 minutes ends before a watermark of an hour passes"
    before = operator.rows(operator.in_window)
    with pytest.raises(BackfillConfigError, match="before the window's end"):
        operator.publish("short")
    assert operator.rows(operator.in_window) == before


def test_a_run_killed_before_its_branch_and_a_publish_killed_after_its_commit_leave_each_row_once(
    operator: Operator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed before the branch was made: nothing recorded, the same command again makes it. A publish
    killed after its commit (which carries the record and the tag): the same command again says it is
    published, and main's window holds the true rows once."""
    with monkeypatch.context() as patched:
        patched.setattr(branch_module, "make_branch", killed)
        with pytest.raises(Killed):
            operator.run("early")
    assert operator.recorded_or_none("early") is None
    operator.run("early")
    assert operator.branch_rows("early") == operator.expected
    with monkeypatch.context() as patched:
        patched.setattr(publish_module, "_tag_parent", killed)
        with pytest.raises(Killed):
            operator.publish("early")
    published = operator.recorded("early")
    assert published.published and published.tag is not None, published
    assert published.tag in IcebergTable(operator.spark, operator.identifier).table.refs()
    again = publish(operator.spark, operator.identifier, "early", str(operator.home / "live"))
    assert again.already, again
    assert operator.rows(operator.in_window) == operator.expected
    operator.assert_kept_beyond("early")


def test_a_run_killed_while_it_cleared_its_branch_clears_it_once_when_run_again(operator: Operator) -> None:
    """The branch made and recorded, then killed before its clearing committed, or after it and before the
    record said so: the same command again clears it (once) and writes the window's rows once."""
    for landed in (False, True):
        branch = f"clearing_{int(landed)}"
        made = make_branch(IcebergTable(operator.spark, operator.identifier), operator.checked(branch))
        if landed:
            operator.spark.sql(f"DELETE FROM {operator.identifier}.branch_{branch} WHERE {made.window_sql()}")
        assert not operator.recorded(branch).cleared
        operator.run(branch)
        assert operator.recorded(branch).cleared
        assert operator.branch_rows(branch) == operator.expected, branch


def test_a_branch_whose_checkpoint_was_lost_is_refused_not_written_twice(
    operator: Operator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after its last batch, its checkpoint removed by hand: run again, its query is another, and
    would compute every row again; refused, nothing written."""
    operator.run_killed_after_last_batch("lost", monkeypatch)
    made = operator.recorded("lost")
    assert made.identity is not None
    assert CheckpointFiles(operator.spark, made.identity.checkpoint).remove()
    with pytest.raises(BackfillError, match="holds batches of query"):
        operator.run("lost")
    assert not operator.branch_rows("lost")


def test_a_compaction_of_main_between_run_and_publish_is_refused_and_corrected_again(
    operator: Operator,
) -> None:
    operator.run("compacted")
    before = operator.rows("true")
    operator.spark.sql(
        f"CALL bergstream.system.rewrite_data_files(table => 'apps.{operator.output}', "
        "options => map('min-input-files', '2'))"
    )
    with pytest.raises(Conflict, match="main changed the window") as refused:
        operator.publish("compacted")
    assert "--start-over" in str(refused.value)
    assert operator.rows("true") == before and not operator.recorded("compacted").published
    operator.run("compacted", start_over=True)
    operator.publish("compacted")
    assert operator.rows(operator.in_window) == operator.expected
    operator.assert_kept_beyond("compacted")


def test_a_publish_after_main_s_history_since_the_branch_expired_is_refused_in_plain_words(
    operator: Operator,
) -> None:
    operator.run("expiring")
    made = operator.recorded("expiring")
    table = IcebergTable(operator.spark, operator.identifier)
    # Once complete, the branch keeps its own snapshots since its base, not main's history before it.
    own = len(table.ancestors(table.branch_head("expiring"), made.base)) + 1
    assert table.table.refs().get("expiring").minSnapshotsToKeep() == own
    # The open correction holds main's snapshots a week: the audit's deadline is a week after the branch.
    assert table.main_snapshot_age()[1] >= HOLD_MS
    report = audit(operator.spark, operator.identifier, made)
    assert report.publish_by is not None and any("publish by" in line for line in report.lines())
    assert datetime.fromisoformat(report.publish_by) > datetime.now(UTC) + timedelta(days=6)
    # Two commits on main (rows a day later), then every snapshot of main but its newest expired: main's
    # history since the branch was made is kept all the same.
    later = (operator.scenario.start + timedelta(days=1)).isoformat()
    for account in (98_000_000, 98_000_001):
        operator.spark.sql(f"INSERT INTO {operator.identifier} SELECT {account}, TIMESTAMP '{later}', "
                           f"TIMESTAMP '{later}', 1L, 1L, 60L, TIMESTAMP '{later}'")  # fmt: skip
    expire = (
        f"CALL bergstream.system.expire_snapshots(table => 'apps.{operator.output}', "
        f"older_than => TIMESTAMP '{datetime.now(UTC).isoformat()}', retain_last => 1)"
    )
    operator.spark.sql(expire)
    table.refresh()
    assert table.reaches(int(table.table.currentSnapshot().snapshotId()), made.base)
    # Main's retention lowered by hand, then expired: the publish is refused in plain words.
    table.table.manageSnapshots().setMaxSnapshotAgeMs("main", 1).commit()
    operator.spark.sql(expire)
    before = operator.rows("true")
    with pytest.raises(HistoryExpired, match=r"main's history since the branch was made .* has expired"):
        operator.publish("expiring")
    assert operator.rows("true") == before


def test_a_live_query_stopped_during_a_correction_holds_its_publish_until_it_has_caught_up(
    operator: Operator,
) -> None:
    """The live query stopped (for a deploy) while the router archived on: a publish would let it append the
    window's rows again once started, so it waits; rows written into the window after the publish are shown
    by verify, and an unpublish then keeps the tag, or puts main's rows back beside them when asked."""
    scenario, start = operator.scenario, operator.scenario.start
    topic = scenario.topics["playback"]
    later = [event for hours in (6, 7) for event in scenario.more(start + timedelta(hours=hours))["playback"]]
    scenario.events["playback"].extend(later)
    corrections.archive(
        operator.stack, operator.spark, topic, "playback", operator.home / "router", len(later)
    )
    longer = {**OUTPUT, "settle": "330m"}
    operator.run("behind", output=longer)
    ended = operator.recorded("behind")
    assert ended.watermark is not None
    with pytest.raises(BackfillError, match=r"the live query .* is at event-time watermark .* behind"):
        operator.publish("behind")
    with pytest.raises(BackfillError, match="no live query has committed a batch"):
        publish(operator.spark, operator.identifier, "behind", str(operator.home / "no_live_query"))
    assert not operator.recorded("behind").published

    # Started again, the live query reads what it missed; then the publish goes through.
    run_app(operator.spark, operator.settings(mode="live"), available_now=True, show_progress=False)
    before = operator.rows(operator.in_window)
    operator.publish("behind")
    assert operator.rows(operator.in_window) == operator.expected
    assert verify(operator.spark, operator.identifier, "behind").ok

    # A row written into the published window since (by hand here): verify shows it; an unpublish is refused
    # and keeps the tag, or, asked to, puts main's rows back and keeps it.
    published = operator.recorded("behind")
    account = 99_000_000
    at, until = ((start + timedelta(minutes=minutes)).isoformat() for minutes in (10, 40))
    operator.spark.sql(
        f"INSERT INTO {operator.identifier} SELECT {account}, TIMESTAMP '{at}', TIMESTAMP '{until}', 1L, 1L, "
        f"60L, TIMESTAMP '{at}'"
    )
    checked = verify(operator.spark, operator.identifier, "behind")
    assert (checked.written_since, checked.removed_since, checked.ok) == (1, 0, False)
    with pytest.raises(BackfillError, match="--keep-later-rows") as refused:
        unpublish(operator.spark, operator.identifier, "behind")
    assert f"tag {published.tag} still holds" in str(refused.value)
    assert published.tag in IcebergTable(operator.spark, operator.identifier).table.refs()
    unpublish(operator.spark, operator.identifier, "behind", keep_later_rows=True)
    late = operator.rows(f"{operator.in_window} AND account_id = {account}")
    assert sum(late.values()) == 1
    assert operator.rows(f"{operator.in_window} AND account_id != {account}") == before


def test_a_correction_is_refused_while_the_router_of_one_partition_is_behind(operator: Operator) -> None:
    """Events of partition 2 in Kafka and not yet archived: the window's rows need them. Partition 0, which
    has had no event since its first hour, is archived to its end, and is not named."""
    scenario, start = operator.scenario, operator.scenario.start
    topic = scenario.topics["playback"]
    late = corrections.send(operator.stack.bootstrap_servers, topic, "playback", 2,
                            corrections.spread(start + timedelta(hours=6), timedelta(minutes=1), 20), 77,
                            corrections.any_account)  # fmt: skip
    settled = {**OUTPUT, "settle": "270m"}
    with pytest.raises(BackfillConfigError, match="does not hold every event ingested before") as refused:
        operator.run("partition", output=settled)
    message = str(refused.value)
    assert f"topic {topic} partition 2 of cluster local: the router is at offset 1500" in message, message
    assert "partition 0" not in message and "partition 1 " not in message
    assert IcebergTable(operator.spark, operator.identifier).correction("partition") is None, (
        "a branch was made"
    )
    # Archived, the correction goes through.
    scenario.events["playback"].extend(late)
    corrections.archive(
        operator.stack, operator.spark, topic, "playback", operator.home / "router", len(late)
    )
    operator.run("partition", output=settled)
    assert operator.branch_rows("partition") == operator.expected
