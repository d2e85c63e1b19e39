"""Backfill throughput on one archive: both topics over 24 ingestion hours (bench/backfill/archive.py).

Measured, each warm (run once beforehand) and in one Spark session (`local[2]`):
- (n) a native Spark batch scan of the window into noop: the upper bound;
- (u) the backfill source reading the window as one epoch (unordered) into noop;
- (b) the backfill source at B = 5, 15 and 60 minutes into noop;
- (s) a strictly ordered single reader: read_batches with exact ingestion order, in Python;
- the sessionizer live (from Kafka, availableNow), as a backfill at B = 15 minutes, and unordered;
- replay of an hour of playbacks into Kafka.
Both tables are read together, aligned, as an application reading both would read them.
"""

from __future__ import annotations

import json
import logging
import platform
import shutil
import time
import uuid
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
    shape_home,
    shape_request,
)
from bench.stack import bench_parser
from bergstream.backfill.read.batches import window_of
from bergstream.backfill.read.order import BoundedOrder
from bergstream.backfill.replay import replay
from bergstream.backfill.runtime.app import output_identifier
from bergstream.backfill.runtime.run import run_app
from bergstream.backfill.runtime.settings import AppSettings
from bergstream.backfill.runtime.sources import Sources
from bergstream.spark import build_spark_session

log = logging.getLogger("bench.backfill")
TABLES = ("impression", "playback")


def machine() -> str:
    import os

    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def settings(
    archive: BenchArchive,
    app: str,
    mode: str,
    checkpoint: Path,
    bound: str | None,
    options: dict[str, str] | None = None,
    max_offsets: int | dict[str, int] = 500_000,
) -> AppSettings:
    """The settings of `app` (a yardstick application of bergstream.apps, or a name for a scan) over the
    archive's window; a bootstrap reads it from its start. `max_offsets`: for every source, or per source."""
    suffix = "".join(f"_{value}" for value in (options or {}).values())
    names = ["playback"] if app == "sessionizer" else list(TABLES)
    per_source = max_offsets if isinstance(max_offsets, dict) else {}
    sources = {
        name: {"topic": name, "table": name, "schema": name, "encoding": ENCODING[name],
               "cluster": CLUSTERS[name],
               "kafka": {"maxOffsetsPerTrigger": str(per_source[name])} if name in per_source else {}}
        for name in names
    }  # fmt: skip
    window: dict[str, Any] = {"start": archive.start, "max_misalignment": bound or "unordered"}
    if mode != "bootstrap":
        window["end"] = archive.end
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
            "backfill": window,
        }
    )


def timed(function: Any) -> tuple[float, Any]:
    started = time.monotonic()
    result = function()
    return time.monotonic() - started, result


def native_scan(spark: Any, archive: BenchArchive) -> tuple[float, int]:
    catalog = archive.stack.config.catalog
    start, end = archive.start.isoformat(), archive.end.isoformat()
    rows = 0
    began = time.monotonic()
    for table in TABLES:
        frame = spark.table(catalog.table_identifier(table)).where(
            f"__metadata__.kafka_ingestion_ts >= '{start}' AND __metadata__.kafka_ingestion_ts < '{end}'"
        )
        frame.write.format("noop").mode("overwrite").save()
        rows += archive.request.counts[table]
    return time.monotonic() - began, rows


def source_scan(spark: Any, archive: BenchArchive, bound: str | None, work: Path) -> dict[str, Any]:
    """Both tables through the backfill source, aligned, into noop; seconds, rows, micro-batches."""
    checkpoint = work / f"source-{bound or 'unordered'}-{time.monotonic_ns()}"
    sources = Sources(spark, settings(archive, "scan", "backfill", checkpoint, bound))
    impressions, playbacks = (sources.stream(name) for name in TABLES)
    frame = impressions.unionByName(playbacks, allowMissingColumns=True)
    query = frame.writeStream.format("noop").option("checkpointLocation", str(checkpoint / "query"))
    began = time.monotonic()
    running = query.trigger(availableNow=True).start()
    while not running.awaitTermination(1):
        pass
    seconds = time.monotonic() - began
    if running.exception() is not None:
        raise RuntimeError(str(running.exception()))
    # The per-batch phases of the last (up to 100) batches Spark keeps.
    durations = [progress.durationMs for progress in running.recentProgress]
    epochs = len(sources.plan().epochs)
    phases: dict[str, float] = {}
    for duration in durations:
        for phase, ms in duration.items():
            phases[phase] = phases.get(phase, 0.0) + ms / len(durations)
    return {"seconds": seconds, "epochs": epochs, "per_batch_ms": phases,
            "rows": sum(archive.request.counts.values())}  # fmt: skip


def strict_reader(archive: BenchArchive) -> tuple[float, int]:
    from bergstream.backfill.read.batches import plan_batches
    from bergstream.backfill.read.order import StrictOrder
    from bergstream.backfill.read.planner import plan

    catalog = archive.stack.config.catalog
    made = plan(catalog, list(TABLES), window_of(archive.start, archive.end), StrictOrder())
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


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--shape", choices=list(SHAPES), default="sparse", help="the archive (archive.py)")
    parser.add_argument("--skip-apps", action="store_true", help="measure the sources only")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    archive = build(shape_request(args.shape), shape_home(args.shape))
    work = OUT / "work"
    shutil.rmtree(work, ignore_errors=True)
    results: dict[str, Any] = {"machine": machine(), "date": datetime.now(UTC).isoformat(),
                               "rows": archive.request.counts}  # fmt: skip
    catalog = archive.stack.config.catalog
    spark = build_spark_session(catalog, master="local[2]", app_name="bench-backfill",
                                conf={"spark.ui.enabled": "false"})  # fmt: skip
    try:
        native_scan(spark, archive)  # warm-up
        seconds, rows = native_scan(spark, archive)
        results["native"] = {"seconds": seconds, "rows_per_s": rows / seconds}
        print(f"(n) native scan into noop: {rows:,} rows in {seconds:.1f}s, {rows / seconds:,.0f} rows/s")
        source_scan(spark, archive, None, work)  # warm-up
        for bound in (None, "60m", "15m", "5m"):
            measured = source_scan(spark, archive, bound, work)
            measured["rows_per_s"] = measured["rows"] / measured["seconds"]
            measured["ratio"] = results["native"]["seconds"] / measured["seconds"]
            results[f"source_{bound or 'unordered'}"] = measured
            phases = ", ".join(f"{k} {v:.0f}" for k, v in measured["per_batch_ms"].items())
            print(f"backfill source, {bound or 'unordered'}: {measured['epochs']} epochs, "
                  f"{measured['seconds']:.1f}s, {measured['rows_per_s']:,.0f} rows/s, "
                  f"{measured['ratio']:.2f} x native; per batch ms: {phases}")  # fmt: skip
        seconds, rows = strict_reader(archive)
        results["strict_reader"] = {"seconds": seconds, "rows_per_s": rows / seconds,
                                    "ratio": results["native"]["seconds"] / seconds}  # fmt: skip
        print(f"(s) strict single reader (read_batches): {rows:,} rows in {seconds:.1f}s")
        if not args.skip_apps:
            for mode, bound in (("live", "15m"), ("backfill", "15m"), ("backfill", None)):
                name = f"sessionizer_{mode}_{bound or 'unordered'}"
                app = settings(archive, "sessionizer", mode, work / name, bound)
                fresh_output(spark, app)
                seconds, report = timed(lambda app=app, mode=mode: run_app(
                    spark, app, available_now=mode == "live", show_progress=False))  # fmt: skip
                rows = report.position.total_rows
                results[name] = {"seconds": seconds, "rows": rows, "rows_per_s": rows / seconds}
                print(f"sessionizer {mode} {bound or 'unordered'}: {rows:,} rows in {seconds:.1f}s, "
                      f"{rows / seconds:,.0f} rows/s")  # fmt: skip
            results["match"] = match_rates(spark, archive, work)
        hour = window_of(archive.start + timedelta(hours=1), archive.start + timedelta(hours=2))
        # A topic of its own: a replay run again into the same topic finds itself complete and sends nothing.
        target = f"bench-replay-{uuid.uuid4().hex[:8]}"
        seconds, report = timed(lambda: replay(
            catalog, "playback", hour, BoundedOrder(timedelta(minutes=15)), target,
            {"bootstrap.servers": archive.bootstrap_servers},
            schema="playback", encoding="json"))  # fmt: skip
        AdminClient({"bootstrap.servers": archive.bootstrap_servers}).delete_topics(
            [target, f"bergstream-replay.{target}"]
        )
        results["replay"] = {
            "seconds": seconds,
            "records": report.records,
            "rows_per_s": report.records / seconds,
        }
        print(f"replay of an hour of playbacks: {report.records:,} records in {seconds:.1f}s")
    finally:
        spark.stop()
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "results.json").write_text(json.dumps(results, indent=2, default=str))
        plot(results)


def plot(results: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, rates = [], []
    for key, label in (("native", "native scan"), ("source_unordered", "source, unordered"),
                       ("source_60m", "B = 60m"), ("source_15m", "B = 15m"), ("source_5m", "B = 5m"),
                       ("strict_reader", "strict, 1 reader")):  # fmt: skip
        if key in results:
            labels.append(label)
            rates.append(results[key]["rows_per_s"] / 1000)
    figure, axis = plt.subplots(figsize=(8, 4))
    axis.bar(labels, rates, color=["#555"] + ["#3b7dd8"] * (len(labels) - 1))
    axis.set_ylabel("thousand rows/s")
    axis.set_title(f"Backfill read throughput, {sum(results['rows'].values()):,} rows ({results['machine']})")
    figure.tight_layout()
    figure.savefig(OUT / "throughput.png", dpi=120)
    print(f"results and plot in {OUT}")


if __name__ == "__main__":
    main()
