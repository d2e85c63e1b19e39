"""The yardstick applications over one window three ways, each in as many micro-batches: a backfill from the
archive against a replay of the same records from Kafka, and the hand-over.

On an archive of bench/backfill/archive.py (`--shape`; Kafka still holds every archived record), for each
application (`--app`), in one `local[2]` Spark session, each run on a fresh checkpoint and output table,
after a warm-up of the application (a live run at an eighth of each source's records per trigger, and a
backfill at B = 60m):
- (b) `backfill run --max-misalignment 15m` over the archive's window: one epoch per micro-batch;
- (k) `app run --available-now` live from Kafka, each source with a `maxOffsetsPerTrigger` of its own so
  that the replay runs as many micro-batches as the backfill did (the attribution application reads ten
  impressions per playback);
- (h) `app run --from <start> --max-misalignment 15m --available-now`: the archive, then Kafka from where
  the archive ends there.
Per run: rows, micro-batches, seconds, rows/s, and the medians over the micro-batches that read rows of
Spark's per-batch phases (durationMs: addBatch, queryPlanning, walCommit, commitOffsets, latestOffset,
...; stateCommit: the state stores' commit time, summed over the stateful operators). The ratios b/k and
h/k are in rows/s. The three outputs are compared: with the applications' watermark delay of an hour,
they are equal.

`--variants` measures each run once per variant of the session's SQL settings (VARIANTS), in the same
session, the variants of a mode one after another, so that a setting's effect is measured in one run of the
bench; the warm-ups run under the first. The first run of each mode pays more (measured: 10-40% on this
machine, whatever the variant): name the baseline on both sides, `--variants default,one-partition,default`.
The bench's "default" is Spark's in-memory state store; the attribution application's settings file keeps its
join state in RocksDB (`rocksdb` here), without which it runs the session's 2 GB driver out of memory at
the 4h archive's density: measure it with `--variants rocksdb`. `--event-log` keeps Spark's
event log in bench/out/apps/events; `--jfr` records the driver with the JDK Flight Recorder
(bench/router/profile.py reads it).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import statistics
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql.streaming.listener import StreamingQueryListener

from bench.backfill.archive import PARTITIONS, SHAPES, BenchArchive, build, shape_home, shape_request
from bench.backfill.run import machine, settings
from bench.handover.run import Batch, measured_run
from bench.stack import bench_parser
from bergstream.errors import first_line
from bergstream.runtime.app import output_identifier
from bergstream.runtime.settings import AppSettings
from bergstream.spark import build_spark_session

log = logging.getLogger("bench.apps")
OUT = Path(__file__).parent.parent / "out" / "apps"
APPS: dict[str, tuple[str, ...]] = {"sessionizer": ("playback",), "attribution": ("impression", "playback")}
BOUND = "15m"
# The bench's modes and the application's: k, a replay from Kafka, is a live run.
MODES = {"kafka": "live", "backfill": "backfill", "handover": "bootstrap"}
# The targets of b/k (bench/README.md's headline figures), in rows/s, per archive shape.
TARGETS = {"4h": 1.5, "dense": 2.0}
# Runtime SQL settings per variant, set before each of its runs and unset after; "default": the session's own.
STATE = "spark.sql.streaming.stateStore"
ROCKSDB_PROVIDER = {
    f"{STATE}.providerClass": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
}
VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    "rocksdb": ROCKSDB_PROVIDER,
    # As deploy/apps/attribution.yaml runs it: each commit writes the changes, not a snapshot of the store.
    "rocksdb-changelog": {**ROCKSDB_PROVIDER, f"{STATE}.rocksdb.changelogCheckpointing.enabled": "true"},
    # And without the read before each write that counts the store's rows, and a block cache of 256 MB
    # per store (Spark's default: 8 MB).
    "rocksdb-tuned": {
        **ROCKSDB_PROVIDER,
        f"{STATE}.rocksdb.changelogCheckpointing.enabled": "true",
        f"{STATE}.rocksdb.trackTotalNumberOfRows": "false",
        f"{STATE}.rocksdb.blockCacheSizeMB": "256",
    },
    "one-partition": {"spark.sql.shuffle.partitions": "1"},
    "local-sessions": {"spark.sql.streaming.sessionWindow.merge.sessions.in.local.partition": "true"},
    "pyspark-listeners": {},
}
# Variants that also listen to the progress as PySpark's own listener does, as bergstream's run and this
# bench did before they read each progress from its JSON (bergstream.query.progress_events): two.
PYSPARK_LISTENERS = {"pyspark-listeners": 2}


def limits(archive: BenchArchive, app: str, batches: int) -> dict[str, int]:
    """Each source's maxOffsetsPerTrigger for a replay of the window in `batches` micro-batches. Kafka's
    source shares a limit among partitions in proportion, rounding each share down: a batch reads up to
    one record per partition less than the limit."""
    return {
        source: math.ceil(archive.request.counts[source] / batches) + 2 * PARTITIONS for source in APPS[app]
    }


def medians(batches: list[Batch]) -> dict[str, float]:
    """Per phase, the median over the micro-batches that read rows."""
    reading = [b for b in batches if b.rows] or batches
    names = sorted({name for b in reading for name in b.phases})
    return {name: statistics.median(b.phases.get(name, 0.0) for b in reading) for name in names}


class PySparkListener(StreamingQueryListener):
    """PySpark's own listener, which converts each progress field by field over py4j, doing nothing more."""

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        pass

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


def measure(spark: Any, app: AppSettings, name: str) -> dict[str, Any]:
    variant = VARIANTS[name]
    previous = {key: spark.conf.get(key, None) for key in variant}
    for key, value in variant.items():
        spark.conf.set(key, value)
    listeners = [PySparkListener() for _ in range(PYSPARK_LISTENERS.get(name, 0))]
    for listener in listeners:
        spark.streams.addListener(listener)
    try:
        seconds, report, batches = measured_run(spark, app)
    finally:
        for listener in listeners:
            spark.streams.removeListener(listener)
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
    rows = sum(b.rows for b in batches)
    return {
        "seconds": seconds,
        "rows": rows,
        "rows_per_s": rows / seconds,
        "batches": len(batches),
        "batches_with_rows": sum(1 for b in batches if b.rows),
        "rows_by_source": report.position.rows,
        "phases_median_ms": medians(batches),
        "batch_ms": [b.ms for b in batches],
    }


def output_rows(spark: Any, app: AppSettings) -> Counter[tuple[Any, ...]]:
    """The rows of the application's output, as a multiset."""
    return Counter(tuple(row) for row in spark.table(output_identifier(app)).collect())


def compare(found: dict[str, Counter[tuple[Any, ...]]]) -> dict[str, Any]:
    """Whether each mode's output holds the same rows as the backfill's; how many differ where not."""
    reference = found["backfill"]
    result: dict[str, Any] = {mode: sum(rows.values()) for mode, rows in found.items()}
    result["equal"] = all(rows == reference for rows in found.values())
    for mode, rows in found.items():
        if rows != reference:
            result[f"{mode}_only"] = sum((rows - reference).values())
            result[f"backfill_not_{mode}"] = sum((reference - rows).values())
    return result


def run_app_modes(
    spark: Any, archive: BenchArchive, app: str, work: Path, variants: list[str]
) -> dict[str, Any]:
    """Each mode once per variant, the variants of a mode one after another so that they meet about the
    same load on the machine."""

    def app_settings(
        mode: str, max_offsets: int | dict[str, int] = 500_000, bound: str = BOUND
    ) -> AppSettings:
        return settings(archive, app, MODES[mode], work / f"{app}-{mode}", bound, max_offsets=max_offsets)

    # The warm-ups run with the first variant's settings: the default state store may not hold the state
    # of a large batch in the driver's memory where another does.
    warm = {source: max(1, archive.request.counts[source] // 8) for source in APPS[app]}
    measure(spark, app_settings("kafka", warm), variants[0])
    measure(spark, app_settings("backfill", bound="60m"), variants[0])
    # A variant named twice is measured twice (default,x,default: the baseline on both sides of x).
    labels = [name if variants[:i].count(name) == 0 else f"{name} #{variants[:i].count(name) + 1}"
              for i, name in enumerate(variants)]  # fmt: skip
    results: dict[str, dict[str, Any]] = {label: {} for label in labels}
    outputs: dict[str, dict[str, Counter[tuple[Any, ...]]]] = {label: {} for label in labels}
    per_source: dict[str, int] | None = None
    for mode in ("backfill", "kafka", "handover"):
        for label, variant in zip(labels, variants, strict=True):
            runs = results[label]
            if mode == "kafka":
                if per_source is None:
                    per_source = limits(archive, app, results[labels[0]]["backfill"]["batches_with_rows"])
                chosen = app_settings(mode, per_source)
            else:
                chosen = app_settings(mode)
            try:
                runs[mode] = measure(spark, chosen, variant)
            except Exception as error:  # a run that fails (out of memory, ...) is a finding: kept, and shown
                runs[mode] = {"error": first_line(error)}
                print(f"{app} [{label}] ({mode[0]}) {mode}: failed: {runs[mode]['error']}")
                continue
            outputs[label][mode] = output_rows(spark, chosen)
            if mode == "kafka":
                runs[mode]["max_offsets_per_trigger"] = per_source
            show(app, label, mode, runs[mode])
    for variant, runs in results.items():
        if any("error" in runs[mode] for mode in MODES):
            continue
        for mode in ("backfill", "handover"):
            runs[f"{mode[0]}/k"] = runs[mode]["rows_per_s"] / runs["kafka"]["rows_per_s"]
        runs["outputs"] = compare(outputs[variant])
        runs["outputs"]["equal_to_first_variant"] = outputs[variant] == outputs[labels[0]]
        print(f"{app} [{variant}]: b/k {runs['b/k']:.2f} x, h/k {runs['h/k']:.2f} x in rows/s; outputs "
              f"{'equal' if runs['outputs']['equal'] else 'NOT EQUAL'}: {runs['outputs']}")  # fmt: skip
    return results


def show(app: str, variant: str, mode: str, run: dict[str, Any]) -> None:
    phases = ", ".join(f"{k} {v:.0f}" for k, v in run["phases_median_ms"].items() if v)
    print(f"{app} [{variant}] ({mode[0]}) {mode}: {run['rows']:,} rows, {run['batches']} micro-batches "
          f"({run['batches_with_rows']} with rows), {run['seconds']:.1f}s, {run['rows_per_s']:,.0f} rows/s; "
          f"median ms per batch: {phases}")  # fmt: skip


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--shape", choices=list(SHAPES), default="4h", help="the archive (archive.py)")
    parser.add_argument(
        "--app", default="sessionizer,attribution", help="comma-separated, of " + ", ".join(APPS)
    )
    parser.add_argument("--variants", default="default", help="comma-separated, of " + ", ".join(VARIANTS))
    parser.add_argument("--event-log", action="store_true", help="Spark's event log in bench/out/apps/events")
    parser.add_argument("--jfr", type=Path, default=None, help="a JFR recording of the driver, to this file")
    parser.add_argument(
        "--work", type=Path, default=OUT / "work", help="the runs' checkpoints (emptied first)"
    )
    args = parser.parse_args()
    apps = [name for name in args.app.split(",") if name]
    variants = [name for name in args.variants.split(",") if name]
    unknown = [name for name in apps if name not in APPS] + [
        name for name in variants if name not in VARIANTS
    ]
    if unknown:
        raise SystemExit(f"unknown: {', '.join(unknown)}")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    archive = build(shape_request(args.shape), shape_home(args.shape))
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    conf = {"spark.ui.enabled": "false"}
    if args.event_log:
        (OUT / "events").mkdir(parents=True, exist_ok=True)
        conf |= {"spark.eventLog.enabled": "true", "spark.eventLog.dir": str((OUT / "events").resolve())}
    if args.jfr is not None:
        conf["spark.driver.extraJavaOptions"] = (
            f"-XX:StartFlightRecording=settings=profile,dumponexit=true,filename={args.jfr}"
        )
    spark = build_spark_session(
        archive.stack.config.catalog, master="local[2]", app_name="bench-apps", conf=conf
    )
    results: dict[str, Any] = {
        "machine": machine(), "date": datetime.now(UTC).isoformat(), "shape": args.shape,
        "rows": archive.request.counts, "bound": BOUND, "target_b_over_k": TARGETS.get(args.shape),
        "apps": {},
    }  # fmt: skip
    try:
        for app in apps:
            results["apps"][app] = run_app_modes(spark, archive, app, work, variants)
    finally:
        spark.stop()
        OUT.mkdir(parents=True, exist_ok=True)
        path = OUT / f"results-{args.shape}-{'-'.join(apps)}.json"
        path.write_text(json.dumps(results, indent=2, default=str))
        if results["apps"]:
            plot(results)


def plot(results: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    apps = results["apps"]
    figure, (rates, phases) = plt.subplots(1, 2, figsize=(13, 4.5))
    colours = {"kafka": "#555", "backfill": "#3b7dd8", "handover": "#d8903b"}
    labels: list[str] = []
    for index, (app, variants) in enumerate(apps.items()):
        for offset, mode in enumerate(MODES):
            runs = next(iter(variants.values()))
            rates.bar(index * 4 + offset, runs[mode].get("rows_per_s", 0) / 1000, color=colours[mode],
                      label=mode if index == 0 else None)  # fmt: skip
        labels.append(app)
    rates.set_xticks([index * 4 + 1 for index in range(len(labels))], labels)
    rates.set_ylabel("thousand rows/s")
    rates.set_title(f"{results['shape']}: same window, same micro-batches")
    rates.legend()
    shown = ("addBatch", "queryPlanning", "latestOffset", "walCommit", "commitOffsets")
    bars: list[str] = []
    bottoms: list[float] = []
    for app, variants in apps.items():
        runs = next(iter(variants.values()))
        for mode in MODES:
            bars.append(f"{app}\n{mode}")
            bottoms.append(0.0)
    for phase in shown:
        heights = [next(iter(variants.values()))[mode].get("phases_median_ms", {}).get(phase, 0.0)
                   for variants in apps.values() for mode in MODES]  # fmt: skip
        phases.bar(range(len(bars)), heights, bottom=bottoms, label=phase)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    phases.set_xticks(range(len(bars)), bars, fontsize=7)
    phases.set_ylabel("median ms per micro-batch")
    phases.set_title("Where a micro-batch's time goes (first variant)")
    phases.legend(fontsize=7)
    figure.suptitle(results["machine"], fontsize=8)
    figure.tight_layout()
    figure.savefig(OUT / f"apps-{results['shape']}-{'-'.join(apps)}.png", dpi=120)
    print(f"results and plot in {OUT}")


if __name__ == "__main__":
    main()
