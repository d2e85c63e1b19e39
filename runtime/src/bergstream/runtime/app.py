"""Starting an application's streaming query: its function, its named sources, its output table.

An application is a function, named `module:function` in its settings, that takes an `AppRun` and returns
the streaming DataFrame it produces; bergstream appends that to the application's output table. Live, the
query runs on the settings' trigger; as a backfill, it runs with an availableNow trigger, one epoch per
micro-batch, and stops by itself at the end of the window. Bootstrapped, it triggers every second, so that
the archive phase runs one epoch after another, and its Kafka phase waits for the settings' trigger
interval between batches (Kafka's maxTriggerDelay), as a live run does.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bergstream.backfill.errors import BackfillConfigError
from bergstream.runtime.settings import AppSettings, Mode
from bergstream.runtime.sources import Sources

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from bergstream.runtime.correct.state import Correction

Application = Callable[["AppRun"], "DataFrame"]
BOOTSTRAP_TRIGGER = "1 second"
log = logging.getLogger("bergstream.backfill")


@dataclass(frozen=True)
class AppRun:
    """What an application is given: its named sources and its own options."""

    spark: SparkSession
    sources: Sources
    options: dict[str, Any]
    mode: Mode


def load_entry(entry: str) -> Application:
    """The function `module:function`, or an error naming what is missing."""
    module_name, _, function_name = entry.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise BackfillConfigError(f"entry {entry}: cannot import module {module_name}: {error}") from error
    function = getattr(module, function_name, None)
    if not callable(function):
        raise BackfillConfigError(f"entry {entry}: module {module_name} has no function {function_name}")
    application: Application = function
    return application


def output_identifier(settings: AppSettings) -> str:
    """`catalog.namespace.table` of the application's output; a bare name lives in namespace `apps`."""
    parts = settings.output_table.split(".")
    if len(parts) == 1:
        parts = ["apps", *parts]
    if len(parts) == 2:
        parts = [settings.catalog.name, *parts]
    return ".".join(parts)


# The properties of an output table bergstream makes: its tasks write the hours of their rows as they come,
# without a shuffle to gather each hour's rows first.
OUTPUT_PROPERTIES = {"write.spark.fanout.enabled": "true", "write.distribution-mode": "none"}


def make_output_table(
    spark: SparkSession, app: str, output: str, result: DataFrame, time_column: str
) -> None:
    """The application's output table, when it has none yet: partitioned by the hour of its time column, so
    that a correction's window holds whole files (correct/branch.py clears them without rewriting any). A
    table that exists is written as it is."""
    from pyspark.errors import AnalysisException
    from pyspark.sql.functions import col
    from pyspark.sql.functions.partitioning import hours
    from pyspark.sql.types import TimestampNTZType, TimestampType

    if spark.catalog.tableExists(output):
        return
    fields = {field.name: field for field in result.schema.fields}
    field = fields.get(time_column)
    if field is None or not isinstance(field.dataType, TimestampType | TimestampNTZType):
        found = "none" if field is None else field.dataType.simpleString()
        raise BackfillConfigError(
            f"{app}: output.time_column {time_column!r} is not a timestamp column of the application's output"
            f" (its type: {found}; its columns: {', '.join(fields)}): name the one that places a row in time"
        )
    writer = spark.createDataFrame([], result.schema).writeTo(output).using("iceberg")
    for name, value in OUTPUT_PROPERTIES.items():
        writer = writer.tableProperty(name, value)
    try:
        writer.partitionedBy(hours(col(time_column))).create()
    except AnalysisException as error:
        if "ALREADY_EXISTS" not in str(error):  # made meanwhile by another run: written as it is
            raise
        return
    log.info("%s: output table %s made, partitioned by the hour of %s", app, output, time_column)


def event_time_watermarked(frame: DataFrame) -> bool:
    """Whether the application's query sets an event-time watermark: then a stateful operator emits a row
    once the watermark passes it, not in the batch that reads its events."""
    return "EventTimeWatermark" in str(frame._jdf.queryExecution().logical().toString())


@dataclass(frozen=True)
class StartedQuery:
    query: StreamingQuery
    sources: Sources
    # The query sets an event-time watermark (event_time_watermarked).
    watermarked: bool


def query_name(settings: AppSettings) -> str:
    return f"bergstream-app-{settings.app}-{settings.mode}"


def start_query(
    spark: SparkSession,
    settings: AppSettings,
    available_now: bool = False,
    sources: Sources | None = None,
    correction: Correction | None = None,
) -> StartedQuery:
    """Start the application as the settings say; `available_now` makes a live run stop when caught up.
    `sources`: those of the run's earlier query, when it starts again; `correction`: the branch a
    correction's backfill writes, made ready (correct/branch.py)."""
    sources = sources or Sources(spark, settings)
    sources.paced = settings.mode == "bootstrap" and not available_now
    result = load_entry(settings.entry)(AppRun(spark, sources, dict(settings.options), settings.mode))
    if not result.isStreaming:
        raise BackfillConfigError(
            f"entry {settings.entry} returned a batch DataFrame: build it from run.sources.stream(...)"
        )
    watermarked = event_time_watermarked(result)
    output = output_identifier(settings)
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {output.rpartition('.')[0]}")
    if settings.output.time_column is not None:
        make_output_table(spark, settings.app, output, result, settings.output.time_column)
    writer = (
        result.writeStream.queryName(query_name(settings))
        .outputMode("append")
        .option("checkpointLocation", settings.checkpoint_location)
    )
    if settings.mode == "backfill" or available_now:
        writer = writer.trigger(availableNow=True)
    elif settings.mode == "bootstrap":
        writer = writer.trigger(processingTime=BOOTSTRAP_TRIGGER)
    else:
        writer = writer.trigger(processingTime=settings.trigger_interval)
    if correction is not None:
        # A correction writes the window's rows into its branch, each micro-batch once (correct/writer.py).
        from bergstream.runtime.correct.writer import BranchWriter

        branch_writer = BranchWriter(spark, output, correction, settings.checkpoint_location)
        return StartedQuery(writer.foreachBatch(branch_writer).start(), sources, watermarked)
    return StartedQuery(writer.toTable(output), sources, watermarked)
