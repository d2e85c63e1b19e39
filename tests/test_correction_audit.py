"""The audit of a correction and the publish's refusal of duplicates, on an output table written here: a key
the branch holds twice is never equal to main's once, the audit gives the same report every time, maps are
compared by their entries, and a publish that would bring a key into main twice is refused, main unchanged."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest

from bergstream.backfill.errors import BackfillError
from bergstream.runtime.correct.audit import audit, duplicated_keys
from bergstream.runtime.correct.branch import IcebergTable
from bergstream.runtime.correct.publish import publish
from bergstream.runtime.correct.state import Correction
from tests.services import Services

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration
START = datetime(2026, 11, 20, tzinfo=UTC)
END = START + timedelta(hours=6)


def _row(account: int, hour: int, events: int, tags: str) -> str:
    start = (START + timedelta(hours=hour)).strftime("%Y-%m-%d %H:%M:%S")
    return f"({account}, TIMESTAMP '{start}+00:00', {events}, {tags})"


def test_the_audit_counts_a_key_held_twice_apart_compares_maps_and_the_publish_refuses_the_duplicate(
    stack: Services, spark: SparkSession
) -> None:
    identifier = f"{stack.catalog.name}.apps.audited"
    spark.sql("CREATE NAMESPACE IF NOT EXISTS " + identifier.rpartition(".")[0])
    spark.sql(f"CREATE TABLE {identifier} (account_id bigint, session_start timestamp, events bigint, "
              "tags map<string, bigint>) USING iceberg")  # fmt: skip
    ab, ba = "map('a', 1L, 'b', 2L)", "map('b', 2L, 'a', 1L)"
    main = [_row(1, 1, 3, ab), _row(2, 1, 3, ab), _row(3, 2, 3, ab), _row(4, 2, 3, ab), _row(9, 7, 1, ab)]
    spark.sql(f"INSERT INTO {identifier} VALUES {', '.join(main)}")
    table = IcebergTable(spark, identifier)
    base = int(table.table.currentSnapshot().snapshotId())
    correction = Correction(app="sessionizer", branch="fix", time_column="session_start",
                            key=("account_id", "session_start"), start=START, end=END, base=base,
                            cleared=True, complete=True)  # fmt: skip
    spark.sql(f"ALTER TABLE {identifier} CREATE BRANCH fix")
    spark.sql(f"DELETE FROM {identifier}.branch_fix WHERE {correction.window_sql()}")
    # 1 the same (its map's entries in another order), 2 changed, 3 twice as it is in main, 4 only in main,
    # 5 only in the branch.
    branch = [_row(1, 1, 3, ba), _row(2, 1, 4, ab), _row(3, 2, 3, ab), _row(3, 2, 3, ab), _row(5, 3, 1, ab)]
    spark.sql(f"INSERT INTO {identifier}.branch_fix VALUES {', '.join(branch)}")
    table.save(correction)

    report = audit(spark, identifier, correction)
    assert report.counts == {"equal": 1, "changed": 2, "only_main": 1, "only_branch": 1}
    assert report.changed_columns == {"events": 1}
    assert report.duplicate_keys == {"main": 0, "branch": 1, "branch_over_main": 1}
    assert report.duplicated == 1 and any("would duplicate" in line for line in report.lines())
    twice = next(sample for sample in report.samples["changed"] if sample["account_id"] == 3)
    assert twice["branch_rows"] == 2 and twice["differing"] == ["(rows)"]
    assert twice["main"]["tags"] == [{"key": "a", "value": 1}, {"key": "b", "value": 2}]
    assert audit(spark, identifier, correction) == report, "the same report every time"
    assert duplicated_keys(spark, identifier, correction) == 1

    before = table.table.currentSnapshot().snapshotId()
    with pytest.raises(BackfillError, match="holds 1 keys of the window more often than main"):
        publish(spark, identifier, "fix", None)
    table.refresh()
    assert table.table.currentSnapshot().snapshotId() == before, "main changed"
    assert table.correction("fix") == correction, "the record changed"

    # The branch's duplicate removed: nothing more is refused.
    spark.sql(f"DELETE FROM {identifier}.branch_fix WHERE account_id = 3")
    spark.sql(f"INSERT INTO {identifier}.branch_fix VALUES {_row(3, 2, 3, ab)}")
    assert duplicated_keys(spark, identifier, correction) == 0
    assert audit(spark, identifier, correction).counts == {"equal": 2, "changed": 1, "only_main": 1,
                                                           "only_branch": 1}  # fmt: skip

    # Counted when its run completed, a branch changed since is counted again by the publish.
    table.save(correction.but(repeated_keys=0, checked_head=table.branch_head("fix")))
    spark.sql(f"INSERT INTO {identifier}.branch_fix VALUES {_row(3, 2, 3, ab)}")
    with pytest.raises(BackfillError, match="holds 1 keys of the window more often than main"):
        publish(spark, identifier, "fix", None)
    spark.sql(f"DELETE FROM {identifier}.branch_fix WHERE account_id = 3")
    spark.sql(f"INSERT INTO {identifier}.branch_fix VALUES {_row(3, 2, 3, ab)}")

    # A column added to main since the branch was made: the branch's rows lack it; the publish is refused.
    spark.sql(f"ALTER TABLE {identifier} ADD COLUMN device string")
    with pytest.raises(BackfillError, match=r"column\(s\) device were added to the output after branch fix"):
        publish(spark, identifier, "fix", None)
    table.refresh()
    assert table.table.currentSnapshot().snapshotId() == before, "main changed"


def test_a_window_of_a_time_column_without_zone_is_the_same_in_every_session_time_zone(
    stack: Services, spark: SparkSession
) -> None:
    identifier = f"{stack.catalog.name}.apps.wall_clock"
    spark.sql(f"CREATE TABLE {identifier} (account_id bigint, session_start timestamp_ntz) USING iceberg")
    times = ("2026-11-19 23:30:00", "2026-11-20 00:30:00", "2026-11-20 06:00:00")
    values = ", ".join(f"({account}, TIMESTAMP_NTZ '{at}')" for account, at in enumerate(times, 1))
    spark.sql(f"INSERT INTO {identifier} VALUES {values}")
    correction = Correction(app="sessionizer", branch="fix", time_column="session_start",
                            key=("account_id", "session_start"), start=START, end=END, base=1,
                            time_zoned=False)  # fmt: skip
    zone = spark.conf.get("spark.sql.session.timeZone")
    try:
        for session_zone in ("UTC", "America/New_York", "Asia/Tokyo"):
            spark.conf.set("spark.sql.session.timeZone", session_zone)
            found = spark.table(identifier).where(correction.window_sql()).collect()
            assert [row.account_id for row in found] == [2], session_zone
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
