"""The hand-over: the sessionizer bootstrapped from 24 hours of archive into live Kafka, in one query.

The archive (bench/backfill/archive.py, an archive of its own in bench/out/handover/stack) holds the
playbacks of 24 ingestion hours; an hour more is then produced into Kafka alone, the live tail the
bootstrap hands over to. Measured, in one `local[2]` Spark session, each on a fresh checkpoint and
output table:
- (h) `app run --app sessionizer --from <start> --max-misalignment 15m --available-now`: the archive in
  epochs of 15 minutes, then Kafka from the positions the archive records;
- (l) its peer: a plain live run of the same application over the same records from Kafka (which still
  holds them all), with as many offsets per trigger as an epoch holds rows, so both run about as many
  micro-batches.
Per micro-batch (from the query's progress): rows, time, and the phase (archive or Kafka). The hand-over
is the time from the end of the last archive micro-batch to the end of the first Kafka one; the rate
across it is the rows of the last archive micro-batches and the first Kafka ones over their time. Both
runs' outputs are compared: they must be equal.
"""

from __future__ import annotations

import json
import logging
import shutil
import statistics
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.backfill.archive import ArchiveRequest, BenchArchive, build, default_start
from bench.backfill.run import machine
from bench.stack import bench_parser
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.query import progress_events
from bergstream.runtime.app import output_identifier
from bergstream.runtime.run import run_app
from bergstream.runtime.run_report import RunReport
from bergstream.runtime.settings import AppSettings
from bergstream.spark import build_spark_session

log = logging.getLogger("bench.handover")
OUT = Path(__file__).parent.parent / "out" / "handover"
AROUND = 4  # micro-batches each side of the switch for the rate across it


@dataclass
class Batch:
    batch_id: int
    ended: float  # epoch seconds: the trigger's start plus its execution time
    ms: float
    rows: int
    phase: str  # "archive", "kafka" or "live"
    # Spark's durationMs (addBatch, queryPlanning, walCommit, commitOffsets, latestOffset, ...) and, under
    # "stateCommit", the state stores' commit time summed over the stateful operators.
    phases: dict[str, float] = field(default_factory=dict)


@dataclass
class Batches:
    """Every micro-batch of the query being measured, from Spark's progress events."""

    batches: list[Batch] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, progress: Any) -> None:
        phase = "live"
        for source in progress.sources:
            try:
                end = json.loads(source.endOffset) if isinstance(source.endOffset, str) else None
            except ValueError:
                end = None
            if isinstance(end, dict) and end.get("phase") in ("archive", "kafka"):
                phase = end["phase"]
        started = datetime.fromisoformat(progress.timestamp.replace("Z", "+00:00")).timestamp()
        ms = float(progress.durationMs.get("triggerExecution", 0))
        phases = {name: float(value) for name, value in progress.durationMs.items()}
        phases["stateCommit"] = float(sum(op.commitTimeMs for op in progress.stateOperators))
        with self.lock:
            self.batches.append(Batch(int(progress.batchId), started + ms / 1000, ms,
                                      int(progress.numInputRows), phase, phases))  # fmt: skip


def settings(archive: BenchArchive, mode: str, checkpoint: Path, max_offsets: int) -> AppSettings:
    document: dict[str, Any] = {
        "app": "sessionizer",
        "entry": "bergstream.apps.sessionizer:sessionizer",
        "mode": mode,
        "sources": {
            "playback": {
                "topic": "playback",
                "table": "playback",
                "schema": "playback",
                "encoding": "json",
                "cluster": "us-east-1",
            }
        },
        "kafka": {"kafka.bootstrap.servers": archive.bootstrap_servers, "startingOffsets": "earliest"},
        "max_offsets_per_trigger": max_offsets,
        "catalog": archive.stack.config.catalog.model_dump(mode="json", exclude_none=True),
        "checkpoint_location": str(checkpoint),
        "output_table": f"bench_handover_{mode}",
    }
    if mode == "bootstrap":
        document["backfill"] = {"start": archive.start, "max_misalignment": "15m"}
    return AppSettings.model_validate(document)


def live_tail(archive: BenchArchive, count: int) -> None:
    """`count` playbacks of the hour after the archive, into Kafka alone (once per archive)."""
    marker = archive.stack.config.data_dir / "tail.json"
    if marker.exists() and json.loads(marker.read_text()).get("count") == count:
        print(f"reusing the live tail of {count:,} playbacks")
        return
    if marker.exists():
        raise SystemExit(
            f"the archive in {archive.stack.config.data_dir} has another tail: remove the folder"
        )
    produce(ProduceRequest(topic="playback", count=count, partitions=4, late_fraction=0.05, encoding="json",
                           seed=11, ingestion_start=archive.end, ingestion_span=timedelta(hours=1)),
            archive.bootstrap_servers, show_progress=False)  # fmt: skip
    marker.write_text(json.dumps({"count": count}))
    print(f"produced a live tail of {count:,} playbacks, after the archive")


def measured_run(spark: Any, app: AppSettings) -> tuple[float, RunReport, list[Batch]]:
    shutil.rmtree(app.checkpoint_location, ignore_errors=True)
    spark.sql(f"DROP TABLE IF EXISTS {output_identifier(app)} PURGE")
    batches = Batches()
    with progress_events(spark, batches.add):
        began = time.monotonic()
        report = run_app(spark, app, available_now=True, show_progress=False)
        seconds = time.monotonic() - began
    return seconds, report, sorted(batches.batches, key=lambda b: b.batch_id)


def rate(batches: list[Batch]) -> float:
    seconds = sum(b.ms for b in batches) / 1000
    return sum(b.rows for b in batches) / seconds if seconds else 0.0


def handover(batches: list[Batch]) -> dict[str, Any]:
    archive = [b for b in batches if b.phase == "archive" and b.rows]
    kafka = [b for b in batches if b.phase == "kafka"]
    first_kafka = next((b for b in kafka if b.rows), None)
    if not archive or first_kafka is None:
        raise SystemExit(f"no switch to measure: {len(archive)} archive and {len(kafka)} Kafka micro-batches")
    last_archive = archive[-1]
    across = archive[-AROUND:] + [b for b in kafka if b.rows][:AROUND]
    return {
        "switch_batch": kafka[0].batch_id,
        "handover_s": first_kafka.ended - last_archive.ended,
        "archive_batch_ms_median": statistics.median(b.ms for b in archive),
        "kafka_batch_ms_median": statistics.median(b.ms for b in kafka if b.rows),
        "switch_batch_ms": [b.ms for b in kafka[:2]],
        "rows_per_s_across": rate(across),
        "rows_per_s_archive": rate(archive),
        "rows_per_s_kafka": rate([b for b in kafka if b.rows]),
        "archive_batches": len(archive),
        "kafka_batches": len([b for b in kafka if b.rows]),
    }


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--playbacks", type=int, default=500_000, help="archived, over --hours")
    parser.add_argument("--hours", type=int, default=24)
    parser.add_argument("--tail", type=int, default=20_833, help="playbacks in Kafka alone, an hour's worth")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    # The archive ends an hour before the last whole hour: the tail's hour is past too.
    request = ArchiveRequest(10_000, args.playbacks, default_start(args.hours + 1), args.hours)
    archive = build(request, home=OUT / "stack")
    live_tail(archive, args.tail)
    work = OUT / "work"
    per_epoch = max(1, args.playbacks // (args.hours * 4))
    spark = build_spark_session(archive.stack.config.catalog, master="local[2]", app_name="bench-handover",
                                conf={"spark.ui.enabled": "false"})  # fmt: skip
    results: dict[str, Any] = {
        "machine": machine(), "date": datetime.now(UTC).isoformat(), "archived": args.playbacks,
        "tail": args.tail, "per_trigger": per_epoch,
    }  # fmt: skip
    try:
        # Warm-up: the JVM compiles the code both runs share.
        measured_run(spark, settings(archive, "live", work / "warm", per_epoch * 8))
        runs: dict[str, dict[str, Any]] = {}
        for mode in ("bootstrap", "live"):
            seconds, report, batches = measured_run(spark, settings(archive, mode, work / mode, per_epoch))
            rows = sum(b.rows for b in batches)
            runs[mode] = {"seconds": seconds, "rows": rows, "rows_per_s": rows / seconds,
                          "batches": len(batches), "report": report}  # fmt: skip
            print(f"({mode[0]}) {mode}: {rows:,} rows in {seconds:.1f}s, {rows / seconds:,.0f} rows/s, "
                  f"{len(batches)} micro-batches")  # fmt: skip
            if mode == "bootstrap":
                results["handover"] = handover(batches)
                results["batches"] = [vars(b) for b in batches]
            else:
                results["live_batches"] = [vars(b) for b in batches]
        found = results["handover"]
        print(f"hand-over at batch {found['switch_batch']}: {found['handover_s']:.2f}s from the last "
              f"archive micro-batch to the first Kafka one (medians: archive "
              f"{found['archive_batch_ms_median']:.0f} ms, Kafka {found['kafka_batch_ms_median']:.0f} ms); "
              f"{found['rows_per_s_across']:,.0f} rows/s across it ({AROUND} each side), "
              f"archive {found['rows_per_s_archive']:,.0f}, "
              f"Kafka {found['rows_per_s_kafka']:,.0f}")  # fmt: skip
        ratio = runs["bootstrap"]["rows_per_s"] / runs["live"]["rows_per_s"]
        print(f"bootstrap / live replay of the same records: {ratio:.2f} x in rows/s")
        outputs = [
            sorted(
                tuple(r) for r in spark.table(output_identifier(settings(archive, mode, work, 1))).collect()
            )
            for mode in ("bootstrap", "live")
        ]
        equal = outputs[0] == outputs[1]
        print(f"outputs: {len(outputs[0]):,} sessions bootstrapped, {len(outputs[1]):,} live, "
              f"{'equal' if equal else 'NOT EQUAL'}")  # fmt: skip
        results["sessions"] = {"bootstrap": len(outputs[0]), "live": len(outputs[1]), "equal": equal}
        for mode, run in runs.items():
            results[mode] = {k: v for k, v in run.items() if k != "report"}
    finally:
        spark.stop()
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "results.json").write_text(json.dumps(results, indent=2, default=str))
        if "batches" in results:
            plot(results)


def plot(results: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(9, 4))
    for key, label, colour in (("batches", "bootstrap (archive, then Kafka)", "#3b7dd8"),
                               ("live_batches", "live replay from Kafka", "#555")):  # fmt: skip
        batches = results.get(key) or []
        axis.plot([b["batch_id"] for b in batches], [b["rows"] / max(b["ms"], 1) for b in batches],
                  label=label, color=colour, linewidth=1)  # fmt: skip
    axis.axvline(
        results["handover"]["switch_batch"], color="#d83b3b", linestyle="--", label="switch to Kafka"
    )
    axis.set_xlabel("micro-batch")
    axis.set_ylabel("thousand rows/s")
    axis.set_title(f"Sessionizer bootstrap, {results['archived']:,} archived + {results['tail']:,} live "
                   f"({results['machine']})")  # fmt: skip
    axis.legend()
    figure.tight_layout()
    figure.savefig(OUT / "handover.png", dpi=120)
    print(f"results and plot in {OUT}")


if __name__ == "__main__":
    main()
