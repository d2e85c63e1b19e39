"""The rows that span a correction's window's edges, replaced whole.

A row covers [time_column, end_column): a session from its first event to its last plus the gap, an hour of
impressions. Placed by its time alone, a row that crosses the window's start or end is kept by one side and
not the other: a corrected session that starts before the end absorbs main's session that starts after it
(kept, its events counted twice), and main's fragment that starts after the start is removed while the
corrected session that starts before it is not written (its events in no row).

So the backfill keeps the rows it computes outside the window too (in its run's table beside the output,
writer.py), and at the run's end each group of rows (the key less the time column: an account, a title)
whose rows cross an edge on either side has its window widened to the nearest points no row of either side
spans: the closure of [start, end) under every row of the group that overlaps it, main's as the branch was
made and the backfill's. In the branch, main's rows of the group in its widened window are replaced by the
backfill's, and the publish replaces them in main with the window's (its conflict check covers the widened
window). A widened window that reaches before the rows read (the read window's start) or past the
application's watermark at the run's end (rows ending after it were never written) cannot be replaced
whole: the correction records why, and its publish is refused, naming the window to read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from bergstream.backfill.read.planner import from_micros, to_micros
from bergstream.runtime.correct.state import Correction
from bergstream.timeparse import format_duration, format_instant

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from bergstream.runtime.correct.branch import IcebergTable

log = logging.getLogger("bergstream.correct")
# The snapshot summary key of the branch's commit of the backfill's rows that complete the spans.
EDGES = "bergstream.correction.edges"
Span = tuple[int, int]  # [start, end) in microseconds


def staging_identifier(identifier: str, branch: str) -> str:
    """The table of every row a correction's run computes (writer.py): beside the output table."""
    catalog, namespace, name = identifier.split(".")
    return f"{catalog}.{namespace}.`{name}__correction_{branch}`"


def closure(rows: Iterable[Span], start: int, end: int) -> Span:
    """[start, end) widened until no row of `rows` overlaps it without lying within it."""
    spans = sorted(rows)
    low, high = start, end
    widened = True
    while widened:
        widened = False
        for first, last in spans:
            if first < high and last > low and (first < low or last > high):
                low, high = min(low, first), max(high, last)
                widened = True
    return low, high


def group_columns(correction: Correction) -> list[str]:
    """What a row's span is followed within: the key less the time column (one group when nothing is left)."""
    return [column for column in correction.key if column != correction.time_column]


def edge_spans(
    spark: SparkSession, identifier: str, correction: Correction, read: tuple[datetime, datetime]
) -> dict[tuple[Any, ...], Span]:
    """Each group whose rows cross the window's edges, and its widened window: read only, in one Spark job
    (it runs beside the copy of the run's rows into the branch)."""
    assert correction.end_column is not None
    by_group = _crossing_rows(spark, identifier, correction, read, group_columns(correction))
    start, end = to_micros(correction.start), to_micros(correction.end)
    spans = {group: closure(own, start, end) for group, own in by_group.items()}
    return {group: span for group, span in spans.items() if span != (start, end)}


def widen(
    spark: SparkSession,
    table: IcebergTable,
    correction: Correction,
    read: tuple[datetime, datetime],
    spans: dict[tuple[Any, ...], Span],
) -> Correction:
    """The correction with its widened window (`spans`, edge_spans') recorded and the branch's rows of it
    replaced by the backfill's; or with the reason they cannot be (`edge_refusal`), the branch left as the
    window's rows."""
    groups = group_columns(correction)
    if not spans:
        return correction
    low = min(span[0] for span in spans.values())
    high = max(span[1] for span in spans.values())
    widened = correction.but(edge_start=from_micros(low), edge_end=from_micros(high), edge_groups=len(spans))
    refusal = _refusal(widened, groups, spans, read)
    if refusal is not None:
        log.warning("%s: %s", table.identifier, refusal)
        return widened.but(edge_refusal=refusal)
    _replace(spark, table, widened, groups, spans)
    log.info(
        "%s: %d groups of rows (by %s) span the window's edges: branch %s replaces them whole, within %s",
        table.identifier, len(spans), ", ".join(groups) or "the whole table", correction.branch,
        widened.replaced_window,
    )  # fmt: skip
    return widened


def _refusal(
    correction: Correction,
    groups: list[str],
    spans: dict[tuple[Any, ...], Span],
    read: tuple[datetime, datetime],
) -> str | None:
    """Why the widened window cannot be replaced whole with the rows the backfill read, or None."""
    low, high = correction.replaced
    through = min(read[1], correction.watermark) if correction.watermark is not None else read[1]

    def named(span: Span) -> str:
        group = next(group for group, found in spans.items() if found == span)
        values = ", ".join(f"{column}={value}" for column, value in zip(groups, group, strict=True))
        first, last = (format_instant(from_micros(instant)) for instant in span)
        return f"{values or 'the rows'} span [{first}, {last})"

    if low < read[0]:
        earliest = min(spans.values())
        return (
            f"the rows that cross the window's edges span back to {format_instant(low)}, before the rows "
            f"read from {format_instant(read[0])} ({named(earliest)}): lengthen output.warm_up to more than "
            f"{format_duration(correction.start - low)} (or start the window earlier) and correct again"
        )
    if high > through:
        latest = max(spans.values(), key=lambda span: span[1])
        return (
            f"the rows that cross the window's edges span to {format_instant(high)}, past the application's "
            f"watermark at the run's end {format_instant(through)}: rows ending after it were not written "
            f"({named(latest)}): lengthen output.settle by more than {format_duration(high - through)} (or "
            "end the window earlier) and correct again"
        )
    return None


def _crossing_rows(
    spark: SparkSession,
    identifier: str,
    correction: Correction,
    read: tuple[datetime, datetime],
    groups: list[str],
) -> dict[tuple[Any, ...], list[Span]]:
    """Each group that has a row crossing the window's start or end, and the spans (microseconds) of its
    rows beyond the window, main's as the branch was made and the backfill's."""
    from pyspark.sql import functions as F

    def spans_of(frame: DataFrame) -> DataFrame:
        first = F.expr(correction.micros_sql(f"`{correction.time_column}`"))
        last = F.expr(correction.micros_sql(f"`{correction.end_column}`"))
        return frame.select(*groups, first.alias("t"), F.coalesce(last, first).alias("e"))

    # A row within the window never widens it: only those that start before it or end after it are read
    # (Iceberg skips the files whose bounds lie within it).
    time, last = f"`{correction.time_column}`", f"`{correction.end_column}`"
    beyond = (
        f"({time} < {correction.literal(correction.start)} OR {last} > {correction.literal(correction.end)})"
    )
    main = spans_of(
        spark.sql(f"SELECT * FROM {identifier} VERSION AS OF {correction.base}").where(
            f"{last} > {correction.literal(read[0])} AND {time} < {correction.literal(read[1])} AND {beyond}"
        )
    )
    staging = staging_identifier(identifier, correction.branch)
    if not spark.catalog.tableExists(staging):
        return {}  # the run computed no row
    both = main.unionByName(spans_of(spark.table(staging).where(beyond)))
    start, end = to_micros(correction.start), to_micros(correction.end)
    crosses = ((F.col("t") < start) & (F.col("e") > start)) | ((F.col("t") < end) & (F.col("e") > end))
    # One job: each group's rows beyond the window, kept where one of them crosses an edge.
    per_group = (
        both.groupBy(*groups)
        .agg(F.max(crosses).alias("crosses"), F.collect_list(F.struct("t", "e")).alias("spans"))
        .where("crosses")
    )
    return {
        tuple(row[column] for column in groups): [(int(span["t"]), int(span["e"])) for span in row["spans"]]
        for row in per_group.collect()
    }


def _replace(
    spark: SparkSession,
    table: IcebergTable,
    correction: Correction,
    groups: list[str],
    spans: dict[tuple[Any, ...], Span],
) -> None:
    """In the branch, main's rows of each group's widened window, outside the window, replaced by the
    backfill's: removed (with the backfill's, from a run of this step killed before it was recorded), then
    the backfill's appended. Run again, it comes to the same rows."""
    from pyspark.sql.types import LongType, StructField, StructType

    branch = f"{table.identifier}.branch_{correction.branch}"
    types = {field.name: field.dataType for field in spark.table(branch).schema.fields}
    schema = StructType(
        [StructField(column, types[column]) for column in groups]
        + [StructField("lo", LongType(), False), StructField("hi", LongType(), False)]
    )
    view = f"bergstream_edges_{correction.branch}"
    spark.createDataFrame([(*group, low, high) for group, (low, high) in spans.items()], schema) \
        .createOrReplaceTempView(view)  # fmt: skip
    time = correction.micros_sql(f"t.`{correction.time_column}`")
    matched = " AND ".join(
        [f"t.`{column}` <=> s.`{column}`" for column in groups]
        + [f"{time} >= s.lo", f"{time} < s.hi", f"NOT {correction.window_sql('t.')}",
           correction.replaced_sql("t.")]
    )  # fmt: skip
    try:
        spark.sql(f"MERGE INTO {branch} AS t USING {view} AS s ON {matched} WHEN MATCHED THEN DELETE")
        _append_spans(spark, table, correction, view, matched, len(spans))
    finally:
        spark.catalog.dropTempView(view)
    table.refresh()


def _append_spans(
    spark: SparkSession, table: IcebergTable, correction: Correction, view: str, matched: str, groups: int
) -> None:
    """The backfill's rows beside the window within the groups' widened windows, appended to the branch."""
    staging = staging_identifier(table.identifier, correction.branch)
    if spark.catalog.tableExists(staging):
        # The run's rows beside the window only: `matched` leaves those of the window out.
        kept = spark.sql(f"SELECT t.* FROM {staging} AS t JOIN {view} AS s ON {matched}")
        branch = f"{table.identifier}.branch_{correction.branch}"
        kept.writeTo(branch).option(f"snapshot-property.{EDGES}", str(groups)).append()


def drop_staging(spark: SparkSession, identifier: str, branch: str) -> bool:
    """The table of the run's rows dropped, its files too: whether there was one."""
    staging = staging_identifier(identifier, branch)
    if not spark.catalog.tableExists(staging):
        return False
    spark.sql(f"DROP TABLE {staging} PURGE")
    return True
