"""The audit of a correction: its branch's rows of the window against main's, by the output's key.

Each key of either side is one of: equal (every column the same), changed (the columns that differ are
named), only in main, only in the branch. The match is the equal keys over all keys, the figure Netflix's
talk gives for a backfill that reproduces production ("matches 99.9 % with prod"); a correction is expected
to differ, and its audit is what a person or a rule reviews before the publish. A key held by several rows
of one side is counted, and its rows compared as one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from bergstream.runtime.correct.state import Correction

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

KINDS = ("equal", "changed", "only_main", "only_branch")


@dataclass(frozen=True)
class Audit:
    table: str
    branch: str
    window: str
    key: list[str]
    counts: dict[str, int]
    # Per column: how many changed keys differ in it.
    changed_columns: dict[str, int]
    # Keys held by more than one row, per side.
    duplicate_keys: dict[str, int]
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def match(self) -> float:
        """The equal keys over every key of either side; 1 when neither side has a row."""
        return self.counts["equal"] / self.total if self.total else 1.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total, "match": self.match}

    def lines(self) -> list[str]:
        lines = [
            f"audit of branch {self.branch} of {self.table}, window {self.window}, key {', '.join(self.key)}",
            f"  {self.total:,} keys: {self.counts['equal']:,} equal, {self.counts['changed']:,} changed, "
            f"{self.counts['only_main']:,} only in main, {self.counts['only_branch']:,} only in the branch",
            f"  match {100 * self.match:.3f} %",
        ]
        if self.changed_columns:
            columns = ", ".join(f"{name} ({count:,})" for name, count in sorted(self.changed_columns.items()))
            lines.append(f"  changed columns: {columns}")
        for side, count in self.duplicate_keys.items():
            if count:
                lines.append(f"  {count:,} keys held by more than one row in {side}")
        for kind in KINDS[1:]:
            for row in self.samples.get(kind, []):
                lines.append(f"  e.g. {kind}: {row}")
        return lines


def audit(spark: SparkSession, identifier: str, correction: Correction, sample: int = 5) -> Audit:
    """Compare the window's rows of `correction`'s branch with main's, in one Spark job per figure."""
    from pyspark.sql import functions as F

    window = correction.window_sql()
    main = spark.table(identifier).where(window)
    branch = spark.table(f"{identifier}.branch_{correction.branch}").where(window)
    key = list(correction.key)
    values = [column for column in main.columns if column not in key]

    def side(frame: DataFrame, name: str) -> DataFrame:
        row = F.first(F.struct(*values)) if values else F.lit(True)
        grouped = frame.groupBy(*key).agg(F.count(F.lit(1)).alias("rows"), row.alias("row"))
        return grouped.select(*[F.col(c).alias(f"k_{c}") for c in key], F.struct("rows", "row").alias(name))

    joined = _joined(side(main, "m"), side(branch, "b"), key)
    differing = F.filter(
        F.array(*[F.when(~F.col(f"m.row.{c}").eqNullSafe(F.col(f"b.row.{c}")), F.lit(c)) for c in values]),
        lambda name: name.isNotNull(),
    ) if values else F.array().cast("array<string>")  # fmt: skip
    kind = (
        F.when(F.col("m").isNull(), "only_branch")
        .when(F.col("b").isNull(), "only_main")
        .when(F.size(differing) == 0, "equal")
        .otherwise("changed")
    )
    classified = joined.select("*", kind.alias("kind"), differing.alias("differing")).cache()
    try:
        counts = {kind: 0 for kind in KINDS}
        counts.update({row.kind: int(row.n) for row in classified.groupBy("kind").agg(F.count("*").alias("n"))
                       .collect()})  # fmt: skip
        changed_columns = {
            row.column: int(row.n)
            for row in classified.where(F.col("kind") == "changed")
            .select(F.explode("differing").alias("column"))
            .groupBy("column")
            .agg(F.count("*").alias("n"))
            .collect()
        }
        duplicates = classified.agg(
            F.count(F.when(F.col("m.rows") > 1, 1)).alias("main"),
            F.count(F.when(F.col("b.rows") > 1, 1)).alias("branch"),
        ).first()
        samples: dict[str, list[dict[str, Any]]] = {}
        for name in KINDS[1:]:
            rows = classified.where(F.col("kind") == name).limit(sample).collect()
            samples[name] = [_sample(row, key, values) for row in rows]
    finally:
        classified.unpersist()
    assert duplicates is not None
    return Audit(
        table=identifier, branch=correction.branch, window=correction.window, key=key, counts=counts,
        changed_columns=changed_columns,
        duplicate_keys={"main": int(duplicates["main"]), "branch": int(duplicates["branch"])},
        samples=samples,
    )  # fmt: skip


def _joined(main: DataFrame, branch: DataFrame, key: list[str]) -> DataFrame:
    """Main's and the branch's rows side by side by key (null keys equal), one row per key of either."""
    from pyspark.sql import functions as F

    left = main.alias("left")
    right = branch.alias("right")
    condition = None
    for column in key:
        equal = F.col(f"left.k_{column}").eqNullSafe(F.col(f"right.k_{column}"))
        condition = equal if condition is None else condition & equal
    joined = left.join(right, on=condition, how="full_outer")
    return joined.select(
        *[F.coalesce(F.col(f"left.k_{c}"), F.col(f"right.k_{c}")).alias(c) for c in key],
        F.col("left.m").alias("m"),
        F.col("right.b").alias("b"),
    )


def _sample(row: Any, key: list[str], values: list[str]) -> dict[str, Any]:
    """A key's row on each side, as JSON values."""
    document: dict[str, Any] = {column: _plain(row[column]) for column in key}
    for side, name in (("m", "main"), ("b", "branch")):
        found = row[side]
        document[name] = None if found is None else {c: _plain(found["row"][c]) for c in values}
    if row["differing"]:
        document["differing"] = list(row["differing"])
    return document


def _plain(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else value
