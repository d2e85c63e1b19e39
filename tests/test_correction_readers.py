"""What readers of an output table see at a publish and an unpublish, as docs/corrections.md says: Spark's
streaming read of the table fails at an overwrite (or a delete) unless told to skip it, and then never sees
the correction; at an append (main had no row in the window) it reads the correction's rows; an incremental
read of appends passes over an overwrite."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from bergstream.runtime.correct.branch import IcebergTable
from bergstream.runtime.correct.publish import publish, unpublish
from bergstream.runtime.correct.state import Correction
from tests.services import Services

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.integration
START = datetime(2026, 11, 20, tzinfo=UTC)
END = START + timedelta(hours=6)
SKIP_OVERWRITES = "streaming-skip-overwrite-snapshots"
SKIP_DELETES = "streaming-skip-delete-snapshots"


def _values(rows: list[tuple[int, int, int]]) -> str:
    """(account, hour after START, events) as SQL values."""
    return ", ".join(
        f"({account}, TIMESTAMP '{(START + timedelta(hours=hour)).isoformat()}', {events})"
        for account, hour, events in rows
    )


def _corrected(spark: SparkSession, name: str, main: list[tuple[int, int, int]],
               branch: list[tuple[int, int, int]]) -> str:  # fmt: skip
    """An output table whose main holds `main`, and a correction of [START, END) in branch `fix` whose rows
    of the window are `branch`, complete."""
    identifier = f"bergstream.apps.{name}"
    spark.sql("CREATE NAMESPACE IF NOT EXISTS bergstream.apps")
    spark.sql(f"CREATE TABLE {identifier} (account_id bigint, session_start timestamp, events bigint) "
              "USING iceberg PARTITIONED BY (hours(session_start))")  # fmt: skip
    spark.sql(f"INSERT INTO {identifier} VALUES {_values([*main, (0, 7, 1)])}")
    table = IcebergTable(spark, identifier)
    correction = Correction(
        app="sessionizer", branch="fix", time_column="session_start", key=("account_id", "session_start"),
        start=START, end=END, base=int(table.table.currentSnapshot().snapshotId()), cleared=True,
        complete=True, watermarked=False,
    )  # fmt: skip
    spark.sql(f"ALTER TABLE {identifier} CREATE BRANCH fix")
    spark.sql(f"DELETE FROM {identifier}.branch_fix WHERE {correction.window_sql()}")
    if branch:
        spark.sql(f"INSERT INTO {identifier}.branch_fix VALUES {_values(branch)}")
    table.save(correction)
    return identifier


def _stream(spark: SparkSession, identifier: str, checkpoint: Path, **options: str) -> list[tuple[int, int]]:
    """What a streaming read of the table reads since its checkpoint's last run: (account, events)."""
    read: list[tuple[int, int]] = []

    def collect(frame: DataFrame, _: int) -> None:
        read.extend((row.account_id, row.events) for row in frame.collect())

    reader = spark.readStream.format("iceberg")
    for name, value in options.items():
        reader = reader.option(name, value)
    query = (
        reader.load(identifier).writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination()
    return sorted(read)


def _operation(spark: SparkSession, identifier: str) -> str:
    return str(IcebergTable(spark, identifier).table.currentSnapshot().operation())


def test_a_streaming_read_fails_at_a_publish_that_overwrites_and_skips_it_when_told(
    spark: SparkSession, stack: Services, tmp_path: Path
) -> None:
    identifier = _corrected(spark, "read_overwrite", main=[(1, 1, 3), (2, 2, 3)], branch=[(1, 1, 5)])
    before = [(0, 1), (1, 3), (2, 3)]
    assert _stream(spark, identifier, tmp_path / "plain") == before
    assert _stream(spark, identifier, tmp_path / "skipping", **{SKIP_OVERWRITES: "true"}) == before
    publish(spark, identifier, "fix", None)
    assert _operation(spark, identifier) == "overwrite"
    with pytest.raises(Exception, match="Cannot process overwrite snapshot"):
        _stream(spark, identifier, tmp_path / "plain")
    assert _stream(spark, identifier, tmp_path / "skipping", **{SKIP_OVERWRITES: "true"}) == []
    unpublish(spark, identifier, "fix")
    assert _operation(spark, identifier) == "overwrite"
    assert _stream(spark, identifier, tmp_path / "skipping", **{SKIP_OVERWRITES: "true"}) == []
    # An incremental read of appends passes over both.
    tagged = spark.sql(f"SELECT snapshot_id FROM {identifier}.refs WHERE name LIKE 'fix-before-%'").first()
    assert tagged is not None
    since = spark.read.format("iceberg").option("start-snapshot-id", str(tagged.snapshot_id)).load(identifier)
    assert since.count() == 0


def test_a_streaming_read_reads_a_publish_into_an_empty_window_as_an_append_and_fails_at_a_delete(
    spark: SparkSession, stack: Services, tmp_path: Path
) -> None:
    appended = _corrected(spark, "read_append", main=[], branch=[(1, 1, 5)])
    assert _stream(spark, appended, tmp_path / "append") == [(0, 1)]
    publish(spark, appended, "fix", None)
    assert _operation(spark, appended) == "append"
    assert _stream(spark, appended, tmp_path / "append") == [(1, 5)]

    deleted = _corrected(spark, "read_delete", main=[(1, 1, 3)], branch=[])
    assert _stream(spark, deleted, tmp_path / "delete") == [(0, 1), (1, 3)]
    assert _stream(spark, deleted, tmp_path / "skip_delete", **{SKIP_DELETES: "true"}) == [(0, 1), (1, 3)]
    publish(spark, deleted, "fix", None)
    assert _operation(spark, deleted) == "delete"
    with pytest.raises(Exception, match="Cannot process delete snapshot"):
        _stream(spark, deleted, tmp_path / "delete")
    assert _stream(spark, deleted, tmp_path / "skip_delete", **{SKIP_DELETES: "true"}) == []
