"""Verify a published correction: the rows written into main's window since the publish (a live query's
rows of the window that it wrote once its watermark passed their end, a second publish, a hand-made
change), and the rows of the publish removed since. A publish waits for the live query to have written every
row the branch holds; what it writes into the window later is shown here, for a person to judge, and kept by
`backfill unpublish --keep-later-rows`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from bergstream.backfill.errors import BackfillError
from bergstream.runtime.correct.audit import comparable
from bergstream.runtime.correct.branch import IcebergTable
from bergstream.runtime.correct.publish import find_commit
from bergstream.runtime.correct.state import PUBLISH_ID

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass(frozen=True)
class Verified:
    table: str
    branch: str
    window: str
    published: int  # main's snapshot of the publish
    written_since: int  # rows of the window in main now and not at the publish
    removed_since: int  # rows of the window at the publish and not in main now
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.written_since == 0 and self.removed_since == 0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}

    def lines(self) -> list[str]:
        lines = [
            f"verify of branch {self.branch} of {self.table}, window {self.window}, published at snapshot "
            f"{self.published}",
            f"  since the publish: {self.written_since:,} rows written into the window, "
            f"{self.removed_since:,} of its rows removed",
        ]
        for kind, rows in self.samples.items():
            lines.extend(f"  e.g. {kind}: {row}" for row in rows)
        return lines


def verify(spark: SparkSession, identifier: str, branch: str, sample: int = 5) -> Verified:
    """Main's rows of the published correction's window now against those its publish left."""
    table = IcebergTable(spark, identifier)
    correction = table.correction(branch)
    assert correction is not None, "checked before Spark started"
    if not correction.published or correction.publish_id is None:
        raise BackfillError(f"{identifier}: branch {branch} is not published: there is nothing to verify")
    published = find_commit(table, PUBLISH_ID, correction.publish_id, correction.base)
    if published is None:
        raise BackfillError(
            f"{identifier}: the publish {correction.publish_id} of branch {branch} is not in main's history "
            "(rolled back, or its snapshot expired): there is nothing to verify against"
        )
    window = correction.replaced_sql()
    now = _rows(spark.table(identifier).where(window))
    then = _rows(spark.sql(f"SELECT * FROM {identifier} VERSION AS OF {published}").where(window))
    written, removed = now.exceptAll(then).cache(), then.exceptAll(now).cache()
    try:
        samples = {
            "written since": [row.asDict(recursive=True) for row in written.limit(sample).collect()],
            "removed since": [row.asDict(recursive=True) for row in removed.limit(sample).collect()],
        }
        return Verified(
            table=identifier, branch=branch, window=correction.replaced_window, published=published,
            written_since=written.count(), removed_since=removed.count(),
            samples={kind: rows for kind, rows in samples.items() if rows},
        )  # fmt: skip
    finally:
        written.unpersist()
        removed.unpersist()


def _rows(frame: DataFrame) -> DataFrame:
    return frame.select(*[comparable(field.dataType, frame[field.name]).alias(field.name)
                          for field in frame.schema.fields])  # fmt: skip
