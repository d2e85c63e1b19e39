"""The audit of a correction: its branch's rows of the window against main's, by the output's key.

Each key of either side is one of: equal (every column the same), changed (the columns that differ are
named), only in main, only in the branch. The match is the equal keys over all keys, the figure Netflix's
talk gives for a backfill that reproduces production ("matches 99.9 % with prod"); a correction is expected
to differ, and its audit is what a person or a rule reviews before the publish. A key held by several rows
of one side is counted, and its rows compared as a whole, in a fixed order: it is equal only when both sides
hold the same rows as many times. A key the branch holds more often than main, and more than once, is a
duplicate a publish would bring into main: `--min-match` fails and the publish is refused on it. Columns of
every type the output can have are compared, maps by their entries in key order.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from bergstream.runtime.correct.branch import IcebergTable
from bergstream.runtime.correct.state import Correction
from bergstream.timeparse import format_instant

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

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
    # Keys held by more than one row, per side; and keys the branch holds more than once and more often than
    # main ("branch_over_main"): rows a publish would duplicate.
    duplicate_keys: dict[str, int]
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # When main's history since the branch was made may expire (ISO): a publish after that is refused.
    publish_by: str | None = None
    # The keys beside the window within its widened window, compared apart: the widened window, how many
    # groups' rows cross its edges, the counts (other groups' keys there count as equal) and samples. None
    # when no row crosses an edge.
    edges: dict[str, Any] | None = None
    # Why the spans that cross the window's edges cannot be replaced whole: the publish is refused.
    edge_refusal: str | None = None

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def match(self) -> float:
        """The equal keys over every key of either side; 1 when neither side has a row."""
        return self.counts["equal"] / self.total if self.total else 1.0

    @property
    def duplicated(self) -> int:
        return self.duplicate_keys.get("branch_over_main", 0)

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
        for side in ("main", "branch"):
            if self.duplicate_keys.get(side):
                lines.append(f"  {self.duplicate_keys[side]:,} keys held by more than one row in {side}")
        if self.duplicated:
            lines.append(f"  {self.duplicated:,} keys held more often in the branch than in main: a publish "
                         "would duplicate their rows")  # fmt: skip
        for kind in KINDS[1:]:
            for row in self.samples.get(kind, []):
                lines.append(f"  e.g. {kind}: {row}")
        if self.edges is not None:
            counts = self.edges["counts"]
            lines.append(
                f"  beside the window, {self.edges['groups']:,} groups' rows cross its edges: replaced whole "
                f"within {self.edges['window']}: {counts['equal']:,} keys equal, {counts['changed']:,} "
                f"changed, {counts['only_main']:,} only in main, {counts['only_branch']:,} only in the branch"
            )
            for kind in KINDS[1:]:
                for row in self.edges["samples"].get(kind, []):
                    lines.append(f"  e.g. beside the window, {kind}: {row}")
        if self.edge_refusal is not None:
            lines.append(f"  a publish is refused: {self.edge_refusal}")
        if self.publish_by is not None:
            lines.append(
                f"  publish by {self.publish_by}: main's snapshots since the branch was made may expire then "
                "(the table's snapshot retention), and a publish would be refused"
            )
        return lines


def audit(spark: SparkSession, identifier: str, correction: Correction, sample: int = 5) -> Audit:
    """Compare the window's rows of `correction`'s branch with main's, in one Spark job per figure; and apart,
    the rows beside the window that its spans across the edges widen it to."""
    window = correction.window_sql()
    main, branch = spark.table(identifier), spark.table(f"{identifier}.branch_{correction.branch}")
    counts, changed_columns, duplicates, samples = _compared(main.where(window), branch.where(window),
                                                             list(correction.key), sample)  # fmt: skip
    edges = None
    if correction.edge_groups and correction.edge_refusal is None:
        beside = f"{correction.replaced_sql()} AND NOT {window}"
        edge_counts, _, _, edge_samples = _compared(main.where(beside), branch.where(beside),
                                                    list(correction.key), sample)  # fmt: skip
        edges = {
            "window": correction.replaced_window, "groups": correction.edge_groups, "counts": edge_counts,
            "samples": edge_samples,
        }  # fmt: skip
    kept_until = IcebergTable(spark, identifier).history_kept_until(correction)
    return Audit(
        table=identifier, branch=correction.branch, window=correction.window, key=list(correction.key),
        counts=counts, changed_columns=changed_columns, duplicate_keys=duplicates, samples=samples,
        publish_by=format_instant(kept_until) if kept_until is not None else None, edges=edges,
        edge_refusal=correction.edge_refusal,
    )  # fmt: skip


def _compared(
    main: DataFrame, branch: DataFrame, key: list[str], sample: int
) -> tuple[dict[str, int], dict[str, int], dict[str, int], dict[str, list[dict[str, Any]]]]:
    """Main's rows against the branch's by key: the keys of each kind, the changed ones per column, the keys
    held more than once, and samples of each kind but equal."""
    from pyspark.sql import functions as F

    values = [column for column in main.columns if column not in key]
    joined = _joined(_side(main, key, values, "m"), _side(branch, key, values, "b"), key)
    # A key held as many times on each side: the columns whose values differ; else the count of its rows.
    same_count = F.col("m.rows") == F.col("b.rows")
    differing = F.filter(
        F.array(
            F.when(~same_count, F.lit("(rows)")),
            *[F.when(same_count & ~_values("m", c).eqNullSafe(_values("b", c)), F.lit(c)) for c in values],
        ),
        lambda name: name.isNotNull(),
    )  # fmt: skip
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
            .where(F.col("column") != "(rows)")
            .groupBy("column")
            .agg(F.count("*").alias("n"))
            .collect()
        }
        over = (F.col("b.rows") > 1) & (F.col("b.rows") > F.coalesce(F.col("m.rows"), F.lit(0)))
        duplicates = classified.agg(
            F.count(F.when(F.col("m.rows") > 1, 1)).alias("main"),
            F.count(F.when(F.col("b.rows") > 1, 1)).alias("branch"),
            F.count(F.when(over, 1)).alias("branch_over_main"),
        ).first()
        samples: dict[str, list[dict[str, Any]]] = {}
        for name in KINDS[1:]:
            rows = classified.where(F.col("kind") == name).orderBy(*key).limit(sample).collect()
            samples[name] = [_sample(row, key, values) for row in rows]
    finally:
        classified.unpersist()
    assert duplicates is not None
    repeated = {name: int(duplicates[name]) for name in ("main", "branch", "branch_over_main")}
    return counts, changed_columns, repeated, samples


def repeated_keys(spark: SparkSession, identifier: str, correction: Correction, staged: bool = False) -> int:
    """The keys of the window the branch holds more than once; `staged`: that the run's rows of the window
    hold more than once (what its copy puts in the branch: writer.py)."""
    if not staged:
        return _branch_repeats(spark, identifier, correction).count()
    from pyspark.sql import functions as F

    from bergstream.runtime.correct.edges import staging_identifier

    staging = staging_identifier(identifier, correction.branch)
    if not spark.catalog.tableExists(staging):
        return 0
    rows = spark.table(staging).where(correction.window_sql())
    return rows.groupBy(*correction.key).agg(F.count(F.lit(1)).alias("b")).where(F.col("b") > 1).count()


def duplicated_keys(spark: SparkSession, identifier: str, correction: Correction) -> int:
    """The keys of the window that the branch holds more than once and more often than main: rows a publish
    would duplicate. Main is read only for the keys the branch repeats (none, on the straight path)."""
    from pyspark.sql import functions as F

    repeated = _branch_repeats(spark, identifier, correction)
    if not repeated.take(1):
        return 0
    key = list(correction.key)
    main = (
        spark.table(identifier).where(correction.window_sql()).groupBy(*key).agg(F.count(F.lit(1)).alias("m"))
    )
    condition = None
    for column in key:
        equal = repeated[column].eqNullSafe(main[column])
        condition = equal if condition is None else condition & equal
    joined = repeated.join(main, on=condition, how="left")
    return joined.where(F.col("b") > F.coalesce(F.col("m"), F.lit(0))).count()


def _branch_repeats(spark: SparkSession, identifier: str, correction: Correction) -> DataFrame:
    """The branch's keys of the window held by more than one row, and how many (`b`)."""
    from pyspark.sql import functions as F

    rows = spark.table(f"{identifier}.branch_{correction.branch}").where(correction.window_sql())
    return rows.groupBy(*correction.key).agg(F.count(F.lit(1)).alias("b")).where(F.col("b") > 1)


def _side(frame: DataFrame, key: list[str], values: list[str], name: str) -> DataFrame:
    """One side's rows by key: how many, and all of them, comparable and in a fixed order."""
    from pyspark.sql import functions as F

    columns = [comparable(frame.schema[c].dataType, F.col(c)).alias(c) for c in values]
    rows = F.array_sort(F.collect_list(F.struct(*columns))) if values else F.array()
    grouped = frame.groupBy(*key).agg(F.count(F.lit(1)).alias("rows"), rows.alias("all"))
    return grouped.select(*[F.col(c).alias(f"k_{c}") for c in key], F.struct("rows", "all").alias(name))


def _values(side: str, column: str) -> Column:
    """One column of a side's rows of a key, in their order."""
    from pyspark.sql import functions as F

    return F.transform(f"{side}.all", lambda row: row[column])


def comparable(data_type: Any, column: Column) -> Column:
    """`column` with every map in it as its entries in key order: Spark compares and sorts no map."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, MapType, StructType

    if not _has_map(data_type):
        return column
    if isinstance(data_type, MapType):
        entries = F.transform(F.map_entries(column), lambda entry: F.struct(
            comparable(data_type.keyType, entry["key"]).alias("key"),
            comparable(data_type.valueType, entry["value"]).alias("value"),
        ))  # fmt: skip
        return F.array_sort(entries)
    if isinstance(data_type, ArrayType):
        return F.transform(column, lambda item: comparable(data_type.elementType, item))
    assert isinstance(data_type, StructType)
    fields = [comparable(field.dataType, column[field.name]).alias(field.name) for field in data_type.fields]
    return F.when(column.isNull(), F.lit(None)).otherwise(F.struct(*fields))


def _has_map(data_type: Any) -> bool:
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(data_type, MapType):
        return True
    if isinstance(data_type, ArrayType):
        return _has_map(data_type.elementType)
    if isinstance(data_type, StructType):
        return any(_has_map(field.dataType) for field in data_type.fields)
    return False


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
        if found is None or not found["all"]:
            document[name] = None
            continue
        document[name] = {c: _plain(found["all"][0][c]) for c in values}
        if found["rows"] > 1:
            document[f"{name}_rows"] = found["rows"]
    if row["differing"]:
        document["differing"] = list(row["differing"])
    return document


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if hasattr(value, "asDict"):
        return {name: _plain(item) for name, item in value.asDict().items()}
    return value.isoformat() if hasattr(value, "isoformat") else value
