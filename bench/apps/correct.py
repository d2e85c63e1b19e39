"""A correction's cost, for the sessionizer over an archive of bench/backfill/archive.py (`--shape`): the
backfill into a branch against today's backfill appending to the output table, the audit, and the publish
with its effect on a live query committing to the same table meanwhile.

    .venv/bin/python -m bench.apps.correct --shape 4h

In one `local[2]` Spark session, on the archive's window [start, end) of ingestion time:
1. a warm-up backfill (into a table of its own);
2. (p) today's backfill: `backfill run` over [start, end), its output appended to the output table P;
3. (c) the correction: `backfill run --branch` of the window [start + warm-up, end - settle) into a branch
   of P, which reads the same [start, end); it makes the branch and clears the window first;
4. (p) today's backfill again, into a table of its own: the first of each kind pays more;
5. the audit of the branch against P's main;
6. a live sessionizer started on P (Kafka, new events produced at 2,000 a second by a thread of the
   bench), then the publish while it commits; its micro-batches' durations before, during and after.
The ratio c/p is of the seconds of each run, over the median of the two (p) runs.
"""

from __future__ import annotations

import json
import logging
import shutil
import statistics
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.backfill.archive import PARTITIONS, SHAPES, build, shape_home, shape_request
from bench.backfill.run import machine, settings, timed
from bench.handover.run import Batches
from bench.stack import bench_parser
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.query import progress_events
from bergstream.runtime.app import output_identifier, start_query
from bergstream.runtime.correct.audit import audit
from bergstream.runtime.correct.branch import IcebergTable
from bergstream.runtime.correct.publish import publish
from bergstream.runtime.run import run_app
from bergstream.runtime.settings import AppSettings, correction
from bergstream.spark import build_spark_session

log = logging.getLogger("bench.apps.correct")
OUT = Path(__file__).parent.parent / "out" / "apps"
WARM_UP, SETTLE = timedelta(hours=1), timedelta(hours=1)
BRANCH = "bench_fix"
LIVE_RATE = 2_000


def with_output(app: AppSettings, output_table: str, checkpoint: Path) -> AppSettings:
    document = app.model_dump()
    document.update(
        output_table=output_table, checkpoint_location=str(checkpoint),
        output={"time_column": "session_start", "key": ["account_id", "session_start"],
                "warm_up": f"{int(WARM_UP.total_seconds())}s", "settle": f"{int(SETTLE.total_seconds())}s"},
    )  # fmt: skip
    return AppSettings.model_validate(document)


def backfill(spark: Any, app: AppSettings) -> float:
    shutil.rmtree(app.checkpoint_location, ignore_errors=True)
    seconds, report = timed(lambda: run_app(spark, app, available_now=True, show_progress=False))
    assert report.complete, report.problems
    return float(seconds)


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--shape", choices=list(SHAPES), default="dense", help="the archive (archive.py)")
    parser.add_argument("--work", type=Path, default=OUT / "correct", help="the runs' checkpoints (emptied)")
    parser.add_argument(
        "--live-seconds", type=float, default=60, help="the live query's run around a publish"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    archive = build(shape_request(args.shape), shape_home(args.shape))
    shutil.rmtree(args.work, ignore_errors=True)
    spark = build_spark_session(
        archive.stack.config.catalog,
        master="local[2]",
        app_name="bench-correct",
        conf={"spark.ui.enabled": "false"},
    )
    base = settings(archive, "sessionizer", "backfill", args.work / "base", "15m")
    results: dict[str, Any] = {
        "machine": machine(), "date": datetime.now(UTC).isoformat(), "shape": args.shape,
        "rows": archive.request.counts["playback"],
    }  # fmt: skip
    try:
        spark.sql("CREATE NAMESPACE IF NOT EXISTS bergstream.apps")
        for name in ("bench_correct_warm", "bench_correct_prod", "bench_correct_again"):
            spark.sql(f"DROP TABLE IF EXISTS bergstream.apps.{name} PURGE")
        backfill(spark, with_output(base, "apps.bench_correct_warm", args.work / "warm"))
        plain = with_output(base, "apps.bench_correct_prod", args.work / "prod")
        results["plain_s"] = backfill(spark, plain)
        print(f"(p) today's backfill: {results['plain_s']:.1f}s", flush=True)
        assert plain.backfill.start is not None and plain.backfill.end is not None
        window = {"start": plain.backfill.start + WARM_UP, "end": plain.backfill.end - SETTLE}
        corrected = correction(
            AppSettings.model_validate(
                {**plain.model_dump(), "backfill": {**plain.backfill.model_dump(), **window},
                 "checkpoint_location": str(args.work / "branch")}
            ),
            BRANCH,
        )  # fmt: skip
        identifier = output_identifier(plain)
        results["branch_s"] = backfill(spark, corrected)
        print(f"(c) into branch {BRANCH}: {results['branch_s']:.1f}s", flush=True)
        results["plain_again_s"] = backfill(
            spark, with_output(base, "apps.bench_correct_again", args.work / "again")
        )
        print(f"(p) today's backfill again: {results['plain_again_s']:.1f}s", flush=True)
        results["c_over_p"] = results["branch_s"] / statistics.median(
            [results["plain_s"], results["plain_again_s"]]
        )
        table = IcebergTable(spark, identifier)
        recorded = table.correction(BRANCH)
        assert recorded is not None
        results["audit_s"], audited = timed(lambda: audit(spark, identifier, recorded))
        results["audit"] = {"counts": audited.counts, "match": audited.match}
        print(f"audit: {results['audit_s']:.1f}s, {audited.counts}, match {audited.match:.5f}", flush=True)
        results["live"] = live_publish(spark, archive, plain, identifier, args)
    finally:
        spark.stop()
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"correct-{args.shape}.json"
    path.write_text(json.dumps(results, indent=2, default=str))
    print(json.dumps({k: v for k, v in results.items() if k != "live"}, indent=2, default=str))
    print(json.dumps({k: v for k, v in results["live"].items() if k != "batches"}, indent=2, default=str))


def live_publish(spark: Any, archive: Any, plain: AppSettings, identifier: str, args: Any) -> dict[str, Any]:
    """A live sessionizer on the output table, fed new events, and the publish in the middle of its run."""
    # Sessions of a few seconds, so that the live query writes rows, and commits, every batch.
    live = AppSettings.model_validate(
        {**plain.model_dump(), "mode": "live", "trigger_interval": "5 seconds",
         "max_offsets_per_trigger": 50_000, "kafka": {**plain.kafka, "startingOffsets": "latest"},
         "checkpoint_location": str(args.work / "live"),
         "options": {"gap": "5 seconds", "watermark_delay": "2 seconds"}}
    )  # fmt: skip
    stop = threading.Event()

    def feed() -> None:
        while not stop.is_set():
            produce(ProduceRequest(topic="playback", schema="playback", count=LIVE_RATE,
                                   partitions=PARTITIONS, rate=LIVE_RATE, seed=int(time.time())),
                    archive.bootstrap_servers, show_progress=False)  # fmt: skip

    batches = Batches()
    feeder = threading.Thread(target=feed, daemon=True)
    with progress_events(spark, batches.add):
        query, _ = start_query(spark, live)
        feeder.start()
        try:
            time.sleep(args.live_seconds / 2)
            began = time.time()
            seconds, published = timed(lambda: publish(spark, identifier, BRANCH))
            ended = time.time()
            print(f"publish: {seconds:.1f}s, {published.lines()[1].strip()}", flush=True)
            time.sleep(args.live_seconds / 2)
        finally:
            stop.set()
            query.stop()
            feeder.join()
    during = [b for b in batches.batches if b.ended - b.ms / 1000 <= ended and b.ended >= began]
    other = [b for b in batches.batches if b not in during and b.rows]

    def median(chosen: list[Any], phase: str | None = None) -> float | None:
        values = [b.phases.get(phase, 0.0) if phase else b.ms for b in chosen]
        return statistics.median(values) if values else None

    return {
        "publish_s": seconds, "rows_removed": published.rows_removed, "rows_added": published.rows_added,
        "files_removed": published.files_removed, "files_added": published.files_added,
        "batch_ms_during": [b.ms for b in during], "batch_ms_median_other": median(other),
        "add_batch_ms_during": [b.phases.get("addBatch") for b in during],
        "add_batch_ms_median_other": median(other, "addBatch"), "batches": len(batches.batches),
    }  # fmt: skip


if __name__ == "__main__":
    main()
