"""Backfill throughput on one archive (bench/backfill/archive.py: `--shape sparse`, `4h` or `dense`).

Measured, each warm (run once beforehand) and in one Spark session (`local[2]`), over a window of the
archive (all of it by default):
- (n) a native Spark batch scan of the window into noop: the yardstick;
- (nf) the same scan of the event's flat columns alone, as Iceberg's vectorized Parquet reader reads
  them, and (nr) of the same columns by its row reader: what the nested `__metadata__` struct costs the
  read, which keeps the vectorized reader off;
- (p) Spark's own Parquet reader over the window's data files, every column, nested ones too (Spark
  reads nested columns vectorized);
- (f) Spark's floor: a `rate-micro-batch` source into noop, as many micro-batches as the source at
  B = 15 minutes runs: what any micro-batch costs in this session;
- (u) the backfill source reading the window as one epoch (unordered) into noop;
- (b) the backfill source at each bound B into noop; its fixed cost per epoch is what an epoch costs
  beyond reading its rows at the unordered rate, ((b) - (u)) / (epochs - 1), set beside the floor, and the
  same from Spark's per-batch medians (a micro-batch's time less its rows' at the unordered batch's rate),
  which the queries' start and stop and a stray slow batch leave alone;
- (s) with --strict, the strictly ordered single reader (read_batches, in Python);
- with --match, the sessionizer live and as a backfill, for the share of sessions both produce.
Both tables are read together, aligned, as an application reading both would read them. With
--windows, the source at B = 15 minutes again over windows of those many hours: the growth with the
window. The applications against replaying Kafka are bench/apps.
"""

from __future__ import annotations

import json
import logging
import platform
import shutil
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from bench.backfill.archive import (
    CLUSTERS,
    ENCODING,
    OUT,
    SHAPES,
    BenchArchive,
    build,
    relayout,
    shape_home,
    shape_request,
)
from bench.stack import bench_parser
from bergstream.backfill.read.batches import window_of
from bergstream.backfill.read.order import BoundedOrder
from bergstream.backfill.replay import replay
from bergstream.query import progress_events
from bergstream.runtime.app import output_identifier
from bergstream.runtime.run import run_app
from bergstream.runtime.settings import AppSettings
from bergstream.runtime.sources import Sources
from bergstream.schemas.archive import INGESTION_TS_COLUMN, METADATA
from bergstream.spark import build_spark_session

log = logging.getLogger("bench.backfill")
TABLES = ("impression", "playback")


def machine() -> str:
    import os

    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


@dataclass(frozen=True)
class Window:
    start: datetime
    end: datetime

    @property
    def hours(self) -> float:
        return (self.end - self.start) / timedelta(hours=1)

    def where(self) -> str:
        return (f"{INGESTION_TS_COLUMN} >= '{self.start.isoformat()}' "
                f"AND {INGESTION_TS_COLUMN} < '{self.end.isoformat()}'")  # fmt: skip


def whole(archive: BenchArchive) -> Window:
    return Window(archive.start, archive.end)


def settings(
    archive: BenchArchive,
    app: str,
    mode: str,
    checkpoint: Path,
    bound: str | None,
    options: dict[str, str] | None = None,
    max_offsets: int | dict[str, int] = 500_000,
    window: Window | None = None,
) -> AppSettings:
    """The settings of `app` (a yardstick application of bergstream.apps, or a name for a scan) over
    `window` (the archive's by default); a bootstrap reads it from its start. `max_offsets`: for every
    source, or per source."""
    suffix = "".join(f"_{value}" for value in (options or {}).values())
    names = ["playback"] if app == "sessionizer" else list(TABLES)
    per_source = max_offsets if isinstance(max_offsets, dict) else {}
    sources = {
        name: {"topic": name, "table": name, "schema": name, "encoding": ENCODING[name],
               "cluster": CLUSTERS[name],
               "kafka": {"maxOffsetsPerTrigger": str(per_source[name])} if name in per_source else {}}
        for name in names
    }  # fmt: skip
    window = window or whole(archive)
    backfill: dict[str, Any] = {"start": window.start, "max_misalignment": bound or "unordered"}
    if mode != "bootstrap":
        backfill["end"] = window.end
    return AppSettings.model_validate(
        {
            "app": app,
            "entry": f"bergstream.apps.{app}:{app}",
            "mode": mode,
            "sources": sources,
            "kafka": {"kafka.bootstrap.servers": archive.bootstrap_servers, "startingOffsets": "earliest"},
            "max_offsets_per_trigger": None if per_source else max_offsets,
            "options": options or {},
            "catalog": archive.stack.config.catalog.model_dump(mode="json", exclude_none=True),
            "checkpoint_location": str(checkpoint),
            "output_table": f"bench_{app}_{mode}_{bound or 'unordered'}{suffix}".replace(" ", ""),
            "backfill": backfill,
        }
    )


def timed(function: Any) -> tuple[float, Any]:
    started = time.monotonic()
    result = function()
    return time.monotonic() - started, result


def row_groups(spark: Any, archive: BenchArchive) -> dict[str, Any]:
    """Per table: its files, their row groups (split offsets) and the row-group size property."""
    catalog = archive.stack.config.catalog
    found = {}
    for table in TABLES:
        identifier = catalog.table_identifier(table)
        files = spark.sql(f"SELECT file_size_in_bytes, split_offsets FROM {identifier}.files").collect()
        properties = {row.key: row.value for row in spark.sql(f"SHOW TBLPROPERTIES {identifier}").collect()}
        found[table] = {
            "files": len(files),
            "row_groups": sum(len(row.split_offsets or [0]) for row in files),
            "mb": sum(row.file_size_in_bytes for row in files) / 1e6,
            "row_group_bytes": properties.get("write.parquet.row-group-size-bytes", "default (128 MiB)"),
        }
    return found


def window_rows(spark: Any, archive: BenchArchive, window: Window) -> int:
    catalog = archive.stack.config.catalog
    return sum(spark.table(catalog.table_identifier(t)).where(window.where()).count() for t in TABLES)


def native_scan(spark: Any, archive: BenchArchive, window: Window) -> float:
    """Seconds to read every column of the window's rows of both tables into noop."""
    catalog = archive.stack.config.catalog
    began = time.monotonic()
    for table in TABLES:
        frame = spark.table(catalog.table_identifier(table)).where(window.where())
        frame.write.format("noop").mode("overwrite").save()
    return time.monotonic() - began


def flat_scan(spark: Any, archive: BenchArchive, vectorized: bool) -> float:
    """Seconds to read the event's own (flat) columns of both tables, whole, into noop: with Iceberg's
    vectorized Parquet reader, or its row reader."""
    catalog = archive.stack.config.catalog
    began = time.monotonic()
    for table in TABLES:
        frame = spark.read.option("vectorization-enabled", str(vectorized).lower()).table(
            catalog.table_identifier(table)
        )
        flat = [field.name for field in frame.schema.fields if field.name != METADATA]
        frame.select(*flat).write.format("noop").mode("overwrite").save()
    return time.monotonic() - began


def parquet_scan(spark: Any, archive: BenchArchive) -> float:
    """Seconds to read the tables' current data files, every column, with Spark's own Parquet reader."""
    catalog = archive.stack.config.catalog
    files = [
        row.file_path
        for table in TABLES
        for row in spark.sql(f"SELECT file_path FROM {catalog.table_identifier(table)}.files").collect()
    ]
    began = time.monotonic()
    for table in TABLES:
        paths = [path for path in files if f"/{table}/" in path]
        spark.read.parquet(*paths).write.format("noop").mode("overwrite").save()
    return time.monotonic() - began


@dataclass
class Batches:
    """The micro-batches of the queries of a block, from Spark's progress events."""

    durations: list[dict[str, float]] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)

    def add(self, progress: Any) -> None:
        self.durations.append({k: float(v) for k, v in progress.durationMs.items()})
        self.rows.append(int(progress.numInputRows))

    def median(self, phase: str) -> float:
        values = [d.get(phase, 0.0) for d in self.durations]
        return statistics.median(values) if values else 0.0

    def phases(self) -> dict[str, float]:
        names = sorted({name for d in self.durations for name in d})
        return {name: self.median(name) for name in names}


def spark_floor(spark: Any, batches: int, work: Path) -> dict[str, Any]:
    """Spark's own cost of a micro-batch in this session: a rate-micro-batch source of 1,000 rows a
    batch into noop, `batches` micro-batches on the same checkpoint manager as the backfill's."""
    checkpoint = work / f"floor-{time.monotonic_ns()}"
    seen = Batches()
    with progress_events(spark, seen.add):
        query = (
            spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 1000).load()
            .writeStream.format("noop").option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="0 seconds").start()
        )  # fmt: skip
        try:
            while len(seen.durations) < batches:
                if query.exception() is not None:
                    raise RuntimeError(f"the rate source into noop failed: {query.exception()}")
                query.awaitTermination(0.5)
        finally:
            query.stop()
    return {"batches": len(seen.durations), "per_batch_ms": seen.phases()}


def source_scan(
    spark: Any, archive: BenchArchive, bound: str | None, work: Path, window: Window
) -> dict[str, Any]:
    """Both tables through the backfill source, aligned, into noop; seconds, micro-batches, phases."""
    checkpoint = work / f"source-{bound or 'unordered'}-{time.monotonic_ns()}"
    app = settings(archive, "scan", "backfill", checkpoint, bound, window=window)
    sources = Sources(spark, app)
    impressions, playbacks = (sources.stream(name) for name in TABLES)
    frame = impressions.unionByName(playbacks, allowMissingColumns=True)
    query = frame.writeStream.format("noop").option("checkpointLocation", str(checkpoint / "query"))
    seen = Batches()
    with progress_events(spark, seen.add):
        began = time.monotonic()
        running = query.trigger(availableNow=True).start()
        while not running.awaitTermination(1):
            pass
        seconds = time.monotonic() - began
    if running.exception() is not None:
        raise RuntimeError(str(running.exception()))
    return {"seconds": seconds, "epochs": len(sources.plan().epochs), "batches": len(seen.durations),
            "rows": sum(seen.rows), "per_batch_ms": seen.phases()}  # fmt: skip


def strict_reader(archive: BenchArchive, window: Window) -> tuple[float, int]:
    from bergstream.backfill.read.batches import plan_batches
    from bergstream.backfill.read.order import StrictOrder
    from bergstream.backfill.read.planner import plan

    catalog = archive.stack.config.catalog
    made = plan(catalog, list(TABLES), window_of(window.start, window.end), StrictOrder())
    began = time.monotonic()
    rows = sum(batch.num_rows for batch in plan_batches(made, catalog))
    return time.monotonic() - began, rows


def fresh_output(spark: Any, app: AppSettings) -> None:
    """Drop the output of the bench's previous run on the same archive: each run starts a new checkpoint."""
    spark.sql(f"DROP TABLE IF EXISTS {output_identifier(app)} PURGE")


def match_rates(spark: Any, archive: BenchArchive, work: Path) -> dict[str, Any]:
    """The sessionizer live and as a backfill at B = 15m, each watermark delay: the share of live sessions
    the backfill reproduces exactly. Live reads about 15 minutes of ingestion time per micro-batch, as a
    job keeping up with the topic would."""
    per_quarter_hour = archive.request.playbacks // (archive.request.hours * 4)
    rates: dict[str, Any] = {}
    for delay in ("1 hour", "10 minutes", "2 minutes"):
        outputs = []
        for mode in ("live", "backfill"):
            checkpoint = work / f"match-{mode}-{delay}".replace(" ", "")
            app = settings(archive, "sessionizer", mode, checkpoint, "15m",
                           options={"watermark_delay": delay}, max_offsets=per_quarter_hour)  # fmt: skip
            fresh_output(spark, app)
            run_app(spark, app, available_now=mode == "live", show_progress=False)
            outputs.append({tuple(row) for row in spark.table(output_identifier(app)).collect()})
        live, backfill = outputs
        matched = len(live & backfill)
        rates[delay] = {"live": len(live), "backfill": len(backfill), "matched": matched,
                        "rate": matched / len(live) if live else 1.0}  # fmt: skip
        print(f"sessionizer, watermark delay {delay}: {len(live):,} live sessions, {len(backfill):,} in the "
              f"backfill at B = 15m, {matched:,} identical: {rates[delay]['rate']:.2%}")  # fmt: skip
    return rates


def best(repeat: int, measure: Any) -> Any:
    """The fastest of `repeat` measurements (dicts by their seconds)."""
    runs = [measure() for _ in range(repeat)]
    return min(runs, key=lambda run: run["seconds"] if isinstance(run, dict) else run)


def measure_sources(
    spark: Any, archive: BenchArchive, window: Window, bounds: list[str], work: Path, repeat: int
) -> dict[str, Any]:
    """Native scan, the source unordered and at each bound, over `window`: rows/s and ratios."""
    rows = window_rows(spark, archive, window)
    native = best(repeat, lambda: native_scan(spark, archive, window))
    results: dict[str, Any] = {"hours": window.hours, "rows": rows,
                               "native": {"seconds": native, "rows_per_s": rows / native}}  # fmt: skip
    print(f"  (n) native scan: {rows:,} rows in {native:.2f}s, {rows / native:,.0f} rows/s")
    for bound in [None, *bounds]:
        measured = best(repeat, lambda bound=bound: source_scan(spark, archive, bound, work, window))
        if measured["rows"] != rows:
            raise RuntimeError(
                f"the source at {bound or 'unordered'} read {measured['rows']:,} rows of {rows:,}"
            )
        measured["rows_per_s"] = rows / measured["seconds"]
        measured["ratio"] = native / measured["seconds"]
        measured["rows_per_epoch"] = rows / measured["epochs"]
        results[f"source_{bound or 'unordered'}"] = measured
    unordered = results["source_unordered"]
    for bound in bounds:
        measured = results[f"source_{bound}"]
        extra = (measured["seconds"] - unordered["seconds"]) / max(measured["epochs"] - 1, 1)
        measured["fixed_ms_per_epoch"] = extra * 1000
        # The same from the medians of Spark's per-batch times, which the start and stop of each query and
        # a slow batch or two leave alone: a micro-batch's time beyond its rows at the unordered rate.
        rows_ms = unordered["per_batch_ms"]["triggerExecution"] / rows * measured["rows_per_epoch"]
        measured["median_fixed_ms_per_epoch"] = measured["per_batch_ms"]["triggerExecution"] - rows_ms
    for bound in [None, *bounds]:
        measured = results[f"source_{bound or 'unordered'}"]
        trigger, job = (measured["per_batch_ms"].get(k, 0.0) for k in ("triggerExecution", "addBatch"))
        fixed = (f", fixed cost {measured['fixed_ms_per_epoch']:.0f} ms an epoch (from the medians "
                 f"{measured['median_fixed_ms_per_epoch']:.0f})" if bound else "")  # fmt: skip
        print(f"  backfill source, {bound or 'unordered'}: {measured['epochs']} epochs of "
              f"{measured['rows_per_epoch']:,.0f} rows, {measured['seconds']:.2f}s, "
              f"{measured['rows_per_s']:,.0f} rows/s, {measured['ratio']:.2f} x native{fixed}; per batch ms: "
              f"trigger {trigger:.0f}, job {job:.0f}")  # fmt: skip
    return results


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--shape", choices=list(SHAPES), default="sparse", help="the archive (archive.py)")
    parser.add_argument("--bounds", default="60m,15m,5m", help="bounds B of the source, comma-separated")
    parser.add_argument("--windows", default="", help="hours: the source at B = 15m over shorter windows too")
    parser.add_argument(
        "--repeat", type=int, default=1, help="measure each read this many times, keep the best"
    )
    parser.add_argument(
        "--row-group-bytes",
        type=int,
        default=None,
        help="rewrite the archive's files into row groups of this size first",
    )
    parser.add_argument("--strict", action="store_true", help="the strict single reader (Python) too")
    parser.add_argument("--match", action="store_true", help="the sessionizer's live/backfill match rates")
    parser.add_argument("--replay", action="store_true", help="a replay of an hour of playbacks into Kafka")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    archive = build(shape_request(args.shape), shape_home(args.shape))
    bounds = [bound for bound in args.bounds.split(",") if bound]
    work = OUT / "work"
    shutil.rmtree(work, ignore_errors=True)
    results: dict[str, Any] = {"machine": machine(), "date": datetime.now(UTC).isoformat(),
                               "shape": args.shape, "archive": asdict(archive.request)}  # fmt: skip
    catalog = archive.stack.config.catalog
    spark = build_spark_session(catalog, master="local[2]", app_name="bench-backfill",
                                conf={"spark.ui.enabled": "false"})  # fmt: skip
    window = whole(archive)
    try:
        if args.row_group_bytes:
            relayout(spark, archive, args.row_group_bytes)
        results["row_groups"] = row_groups(spark, archive)
        print(f"row groups: {results['row_groups']}")
        print(f"warming up on the {args.shape} archive ({window.hours:.0f} hours)")
        native_scan(spark, archive, window)
        source_scan(spark, archive, "15m", work, window)
        spark_floor(spark, 20, work)
        print(f"the {args.shape} archive, {window.hours:.0f} hours, {machine()}")
        results.update(measure_sources(spark, archive, window, bounds, work, args.repeat))
        rows = results["rows"]
        scans: list[tuple[str, Callable[[], float]]] = [
            ("flat_vectorized", lambda: flat_scan(spark, archive, vectorized=True)),
            ("flat_rows", lambda: flat_scan(spark, archive, vectorized=False)),
            ("parquet", lambda: parquet_scan(spark, archive)),
        ]
        for name, measure in scans:
            measure()  # warm-up
            seconds = best(args.repeat, measure)
            results[name] = {"seconds": seconds, "rows_per_s": rows / seconds,
                             "ratio": results["native"]["seconds"] / seconds}  # fmt: skip
        print(f"  (nf) flat columns, vectorized: {results['flat_vectorized']['ratio']:.2f} x native; "
              f"(nr) flat columns, row reader: {results['flat_rows']['ratio']:.2f} x; "
              f"(p) Spark's Parquet reader, every column: {results['parquet']['ratio']:.2f} x")  # fmt: skip
        epochs = results.get("source_15m", {}).get("epochs", 24)
        floor = spark_floor(spark, epochs, work)
        results["floor"] = floor
        floor_ms = floor["per_batch_ms"]["triggerExecution"]
        print(f"  (f) Spark's floor (rate-micro-batch into noop): {floor_ms:.0f} ms a micro-batch "
              f"(median of {floor['batches']})")  # fmt: skip
        for bound in bounds:
            measured = results[f"source_{bound}"]
            measured["fixed_over_floor"] = measured["fixed_ms_per_epoch"] / floor_ms
            measured["median_fixed_over_floor"] = measured["median_fixed_ms_per_epoch"] / floor_ms
            print(f"  B = {bound}: beyond its rows, {measured['fixed_ms_per_epoch']:.0f} ms an epoch, "
                  f"{measured['fixed_over_floor']:.2f} x the floor; from the medians "
                  f"{measured['median_fixed_ms_per_epoch']:.0f} ms, "
                  f"{measured['median_fixed_over_floor']:.2f} x")  # fmt: skip

        growth = {}
        for hours in (float(h) for h in args.windows.split(",") if h):
            print(f"window of {hours:g} hours")
            part = Window(archive.start, archive.start + timedelta(hours=hours))
            growth[f"{hours:g}h"] = measure_sources(spark, archive, part, ["15m"], work, args.repeat)
        results["windows"] = growth
        if args.strict:
            seconds, read = strict_reader(archive, window)
            results["strict_reader"] = {"seconds": seconds, "rows_per_s": read / seconds,
                                        "ratio": results["native"]["seconds"] / seconds}  # fmt: skip
            print(f"  (s) strict single reader (read_batches): {read:,} rows in {seconds:.1f}s")
        if args.match:
            results["match"] = match_rates(spark, archive, work)
        if args.replay:
            results["replay"] = replay_hour(archive)
    finally:
        spark.stop()
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"results-{args.shape}.json").write_text(json.dumps(results, indent=2, default=str))
        plot(results)


def replay_hour(archive: BenchArchive) -> dict[str, Any]:
    hour = window_of(archive.start + timedelta(hours=1), archive.start + timedelta(hours=2))
    # A topic of its own: a replay run again into the same topic finds itself complete and sends nothing.
    target = f"bench-replay-{uuid.uuid4().hex[:8]}"
    seconds, report = timed(lambda: replay(
        archive.stack.config.catalog, "playback", hour, BoundedOrder(timedelta(minutes=15)), target,
        {"bootstrap.servers": archive.bootstrap_servers}, schema="playback", encoding="json"))  # fmt: skip
    AdminClient({"bootstrap.servers": archive.bootstrap_servers}).delete_topics(
        [target, f"bergstream-replay.{target}"]
    )
    print(f"replay of an hour of playbacks: {report.records:,} records in {seconds:.1f}s")
    return {"seconds": seconds, "records": report.records, "rows_per_s": report.records / seconds}


def plot(results: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, rates = [], []
    for key, label in (("native", "native scan"), ("flat_vectorized", "flat, vectorized"),
                       ("parquet", "Spark Parquet"), ("source_unordered", "source, unordered"),
                       ("source_60m", "B = 60m"), ("source_15m", "B = 15m"), ("source_5m", "B = 5m"),
                       ("strict_reader", "strict, 1 reader")):  # fmt: skip
        if key in results:
            labels.append(label)
            rates.append(results[key]["rows_per_s"] / 1000)
    if not labels:
        return
    figure, (bars, growth) = plt.subplots(1, 2, figsize=(13, 4))
    bars.bar(labels, rates, color=["#555"] * 3 + ["#3b7dd8"] * (len(labels) - 3))
    bars.set_ylabel("thousand rows/s")
    bars.tick_params(axis="x", labelrotation=30)
    bars.set_title(f"{results['shape']} archive, {results.get('rows', 0):,} rows ({results['machine']})")
    points = sorted(
        (value["rows_per_epoch"], value["ratio"])
        for key, value in results.items()
        if key.startswith("source_") and "rows_per_epoch" in value and key != "source_unordered"
    )
    if points:
        growth.plot([p[0] for p in points], [p[1] for p in points], marker="o")
        growth.set_xscale("log")
        growth.set_xlabel("rows per epoch")
        growth.set_ylabel("source / native scan")
        growth.set_title("the bounded source against the native scan")
    figure.tight_layout()
    figure.savefig(OUT / f"throughput-{results['shape']}.png", dpi=120)
    print(f"results and plot in {OUT}")


if __name__ == "__main__":
    main()
