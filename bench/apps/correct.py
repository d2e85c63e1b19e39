"""A correction's cost, for the sessionizer over an archive of bench/backfill/archive.py (`--shape`): the
backfill into a branch against today's backfill appending to the output table, the audit, and the publish
with its effect on a live query committing to the same table meanwhile.

    .venv/bin/python -m bench.apps.correct --shape 4h

In one `local[2]` Spark session, on the archive's window [start, end) of ingestion time:
1. today's backfill: `backfill run` over [start, end), its output appended to the output table P (made by
   bergstream: partitioned by the hour of its time column); P copied into P_flat, unpartitioned;
2. one run of each kind below to warm up, then five rounds (`--rounds`) of each, in turn:
   (p) today's backfill over [start, end) into a table of its own;
   (c) the correction: `backfill run --branch` of the window [start + warm-up, end - settle) into a branch
   of P, which reads the same [start, end): the branch made, cleared of main's rows of the window (timed
   apart, as the command does them), then the query;
   (p_flat), (c_flat): the same with unpartitioned tables like P_flat (the clearing rewrites the files
   that straddle the window);
   each run's seconds split into its micro-batches' (Spark's progress), the branch's making and clearing,
   and the rest; each branch but the last of (c) released and its snapshots expired after its run, so that
   P holds one correction at a time, its metadata the size of the (p) tables';
3. the audit of the last branch against P's main;
4. a live sessionizer started on P (Kafka, new events produced at 2,000 a second by a thread of the
   bench), and the branch published and unpublished in turn, 3 s apart, while it commits: the times of
   each, and the live query's micro-batches' durations while one of them runs and otherwise.
The ratios c/p are of the medians of each kind's seconds, and the median of each round's c over its p.
"""

from __future__ import annotations

import json
import logging
import shutil
import statistics
import threading
import time
from collections.abc import Callable
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
from bergstream.runtime.checkpoint import CheckpointFiles, committed_watermark
from bergstream.runtime.correct.audit import audit
from bergstream.runtime.correct.branch import LAST_STEPS, IcebergTable, clear_branch, make_branch
from bergstream.runtime.correct.identity import new_run
from bergstream.runtime.correct.publish import publish, unpublish
from bergstream.runtime.correct.release import release
from bergstream.runtime.run import run_app
from bergstream.runtime.settings import AppSettings, correction
from bergstream.spark import build_spark_session

log = logging.getLogger("bench.apps.correct")
OUT = Path(__file__).parent.parent / "out" / "apps"
WARM_UP, SETTLE = timedelta(hours=1), timedelta(hours=1)
BRANCH = "bench_fix"
LIVE_RATE = 2_000
ROUNDS = 5  # runs of each kind, in turn, after one of each to warm up


def with_output(app: AppSettings, output_table: str, checkpoint: Path) -> AppSettings:
    document = app.model_dump()
    document.update(
        output_table=output_table, checkpoint_location=str(checkpoint),
        output={"time_column": "session_start", "end_column": "session_end",
                "key": ["account_id", "session_start"], "warm_up": f"{int(WARM_UP.total_seconds())}s",
                "settle": f"{int(SETTLE.total_seconds())}s"},
    )  # fmt: skip
    return AppSettings.model_validate(document)


class Profile:
    """Where a kind of run's seconds go: its micro-batches (Spark's progress: their count and seconds, and
    the seconds of their writes, `addBatch`), the branch's making and clearing, and the rest."""

    def __init__(self) -> None:
        self.runs: list[dict[str, float]] = []

    def backfill(self, spark: Any, app: AppSettings, **before: float) -> float:
        """`backfill(spark, app)`, profiled; `before`: seconds spent before it, counted in its total."""
        batches = Batches()
        with progress_events(spark, batches.add):
            seconds = backfill(spark, app)
        run = {
            **before,
            "batches": len(batches.batches),
            "batches_s": sum(b.ms for b in batches.batches) / 1000,
            "writes_s": sum(b.phases.get("addBatch", 0.0) for b in batches.batches) / 1000,
        }
        run["total_s"] = seconds + sum(before.values())
        run["rest_s"] = run["total_s"] - run["batches_s"] - sum(before.values())
        self.runs.append(run)
        return float(run["total_s"])

    def medians(self) -> dict[str, float]:
        return {name: statistics.median(run[name] for run in self.runs) for name in self.runs[-1]}


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
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="runs of each kind, after one to warm up")
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
        rounds = args.rounds
        runs = [*range(rounds), "warm"]
        tables = ["bench_correct_prod", "bench_correct_prod_flat"]
        tables += [f"bench_correct_plain_{run}{suffix}" for run in runs for suffix in ("", "_flat")]
        for name in tables:
            spark.sql(f"DROP TABLE IF EXISTS bergstream.apps.{name} PURGE")
        plain = with_output(base, "apps.bench_correct_prod", args.work / "prod")
        backfill(spark, plain)  # the output to correct; the first run of a session pays more
        identifier = output_identifier(plain)
        # The same output in a table made unpartitioned.
        flat = with_output(base, "apps.bench_correct_prod_flat", args.work / "prod_flat")
        spark.sql(f"CREATE TABLE {output_identifier(flat)} USING iceberg AS SELECT * FROM {identifier}")
        assert plain.backfill.start is not None and plain.backfill.end is not None
        window = {"start": plain.backfill.start + WARM_UP, "end": plain.backfill.end - SETTLE}

        def today(run: str, profile: Profile, suffix: str = "") -> float:
            """(p): today's backfill, appending to a table of its own (made unpartitioned for `_flat`)."""
            name = f"apps.bench_correct_plain_{run}{suffix}"
            if suffix:
                spark.sql(
                    f"CREATE TABLE bergstream.{name} USING iceberg AS SELECT * FROM {identifier} WHERE false"
                )
            return profile.backfill(spark, with_output(base, name, args.work / f"plain_{run}{suffix}"))

        def corrected(branch: str, profile: Profile, output: AppSettings = plain) -> float:
            """(c): `backfill run --branch` into `output`, its branch made and cleared (as prepare_branch does
            them) timed apart; the query then finds them done."""
            chosen = correction(
                AppSettings.model_validate(
                    {**output.model_dump(), "backfill": {**output.backfill.model_dump(), **window},
                     "checkpoint_location": str(args.work / branch)}
                ),
                branch,
                run=new_run(),
            )  # fmt: skip
            shutil.rmtree(chosen.checkpoint_location, ignore_errors=True)
            table = IcebergTable(spark, output_identifier(output))
            made_s, made = timed(lambda: make_branch(table, chosen))
            cleared_s, _ = timed(lambda: clear_branch(table, made))
            seconds = profile.backfill(spark, chosen, make_s=made_s, clear_s=cleared_s)
            # The run's end, within rest_s: its rows copied into the branch, the edges, the keys counted,
            # the record, the run's table dropped.
            profile.runs[-1].update({f"end_{name}_s": value for name, value in LAST_STEPS.items()})
            return seconds

        def discard(output: AppSettings, branch: str) -> None:
            """A branch measured and not kept: released, its snapshots expired, so that the output table
            holds one correction at a time, as a user's does, its metadata the size of (p)'s tables'."""
            table = IcebergTable(spark, output_identifier(output))
            made = table.correction(branch)
            assert made is not None
            since = table.ancestors(table.branch_head(branch), made.base)
            release(spark, output.catalog, output_identifier(output), branch)
            table.refresh()
            expire = table.table.expireSnapshots()
            for snapshot in since:
                expire = expire.expireSnapshotId(snapshot.snapshotId())
            expire.commit()

        def kind(name: str, run: str) -> Callable[[Profile], float]:
            """One run of kind `name` (p, c, p_flat, c_flat), named for `run`."""
            if name.startswith("p"):
                return lambda profile: today(run, profile, name[1:])
            output = flat if name == "c_flat" else plain
            branch = BRANCH if (name, run) == ("c", str(rounds - 1)) else f"{BRANCH}_{name}_{run}"

            def measured(profile: Profile) -> float:
                seconds = corrected(branch, profile, output)
                if branch != BRANCH:
                    discard(output, branch)
                return seconds

            return measured

        kinds = ("p", "c", "p_flat", "c_flat")
        profiles = {name: Profile() for name in kinds}
        # Each kind warmed once, then in turn: (p), (c), (p_flat), (c_flat), (p), ...
        for name in kinds:
            kind(name, "warm")(Profile())
        for round_ in range(rounds):
            for name in kinds:
                kind(name, str(round_))(profiles[name])
                last = profiles[name].runs[-1]
                print(f"({name}) {last['total_s']:.2f}s: " + ", ".join(
                    f"{part} {value:.2f}" for part, value in last.items() if part != "total_s"
                ), flush=True)  # fmt: skip
        for name, profile in profiles.items():
            results[name] = profile.runs
            results[f"{name}_median"] = profile.medians()
        results["plain_s"] = [run["total_s"] for run in profiles["p"].runs]
        results["branch_s"] = [run["total_s"] for run in profiles["c"].runs]
        results["c_over_p"] = statistics.median(results["branch_s"]) / statistics.median(results["plain_s"])
        # Each round's (c) over the (p) run just before it, a peer within seconds: their median.
        for c, p in (("c", "p"), ("c_flat", "p_flat")):
            pairs = zip(profiles[c].runs, profiles[p].runs, strict=True)
            paired = [corrected["total_s"] / today["total_s"] for corrected, today in pairs]
            results[f"{c}_over_{p}_paired"] = {"median": statistics.median(paired), "each": paired}
        results["c_flat_over_p_flat"] = (
            results["c_flat_median"]["total_s"] / results["p_flat_median"]["total_s"]
        )
        print(f"c/p {results['c_over_p']:.3f} (paired {results['c_over_p_paired']['median']:.3f}); "
              f"unpartitioned: {results['c_flat_over_p_flat']:.3f} "
              f"(paired {results['c_flat_over_p_flat_paired']['median']:.3f}); "
              f"medians {json.dumps({k: results[f'{k}_median'] for k in kinds})}", flush=True)  # fmt: skip
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
    print(json.dumps(results["live"], indent=2, default=str))
    plot(results, path.with_suffix(".png"))


def plot(results: dict[str, Any], path: Path) -> None:
    """Each round's seconds of each kind, the branch's making and clearing in (c); the publishes' and
    unpublishes'."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (runs, commits) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.2
    for at, (kind, label) in enumerate(
        [("p", "(p) today's backfill"), ("c", "(c) backfill run --branch"),
         ("p_flat", "(p_flat) unpartitioned"), ("c_flat", "(c_flat) unpartitioned")]
    ):  # fmt: skip
        measured = results.get(kind, [])
        offsets = [r + (at - 1.5) * width for r in range(len(measured))]
        runs.bar(offsets, [run["total_s"] for run in measured], width, label=label)
        if kind.startswith("c"):
            runs.bar(offsets, [run["make_s"] + run["clear_s"] for run in measured], width, color="black",
                     label="branch made and cleared" if kind == "c" else None)  # fmt: skip
    runs.set_xlabel("round")
    runs.set_ylabel("seconds")
    runs.set_title(f"backfill, {results['shape']} archive: c/p {results.get('c_over_p', 0):.2f} x")
    kinds = ("p", "c", "p_flat", "c_flat")
    tallest = max((run["total_s"] for kind in kinds for run in results.get(kind, [])), default=1.0)
    runs.set_ylim(0, tallest * 1.45)
    runs.legend(loc="upper left", ncol=2, fontsize=8)
    actions = results.get("live", {}).get("actions", [])
    commits.bar(range(len(actions)), [a["seconds"] for a in actions],
                color=["#3b7dd8" if a["what"] == "publish" else "#d8903b" for a in actions])  # fmt: skip
    commits.set_xlabel("publish (blue) and unpublish (orange), in turn, beside a live query")
    commits.set_ylabel("seconds")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    print(f"plot: {path}")


def wait_for_watermark(spark: Any, checkpoint: str, identifier: str, timeout: float = 120.0) -> None:
    """Until the live query of `checkpoint` has committed a batch whose watermark passes the branch's."""
    recorded = IcebergTable(spark, identifier).correction(BRANCH)
    assert recorded is not None and recorded.watermark is not None
    needed = recorded.watermark.timestamp() * 1000
    deadline = time.monotonic() + timeout
    while (committed_watermark(CheckpointFiles(spark, checkpoint)) or 0) < needed:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"the live query of {checkpoint} has not passed the watermark {recorded.watermark}"
            )
        time.sleep(0.5)


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
    actions: list[tuple[str, float, float, float]] = []  # what, began, ended, seconds
    with progress_events(spark, batches.add):
        query = start_query(spark, live).query
        feeder.start()
        try:
            # A publish waits for the live query's watermark to pass the backfill's: its first batches'.
            wait_for_watermark(spark, live.checkpoint_location, identifier)
            # Published and unpublished in turn, a few seconds apart, while the live query commits.
            deadline = time.monotonic() + args.live_seconds
            action = publish
            while time.monotonic() < deadline:
                time.sleep(3)
                began = time.time()
                # A publish checks the live query's checkpoint: it waits for the window's rows written.
                seconds, done = timed(
                    lambda action=action: publish(spark, identifier, BRANCH, live.checkpoint_location)
                    if action is publish else unpublish(spark, identifier, BRANCH)
                )  # fmt: skip
                actions.append((done.action, began, time.time(), seconds))
                print(f"{done.action}: {seconds:.2f}s, {done.lines()[1].strip()}", flush=True)
                action = unpublish if action is publish else publish
            time.sleep(5)
        finally:
            stop.set()
            query.stop()
            feeder.join()
    if actions and actions[-1][0] == "unpublish":
        publish(spark, identifier, BRANCH, None)

    def overlaps(batch: Any) -> bool:
        return any(
            batch.ended - batch.ms / 1000 <= ended and batch.ended >= began for _, began, ended, _ in actions
        )

    written = [b for b in batches.batches if b.rows]
    during = [b for b in written if overlaps(b)]
    other = [b for b in written if not overlaps(b)]

    def median(chosen: list[Any], phase: str | None = None) -> float | None:
        values = [b.phases.get(phase, 0.0) if phase else b.ms for b in chosen]
        return statistics.median(values) if values else None

    return {
        "actions": [{"what": what, "seconds": seconds} for what, _, _, seconds in actions],
        "publish_s_median": median_of([s for what, _, _, s in actions if what == "publish"]),
        "unpublish_s_median": median_of([s for what, _, _, s in actions if what == "unpublish"]),
        "live_batches": len(written), "live_batches_during": len(during),
        "batch_ms_median_during": median(during), "batch_ms_median_other": median(other),
        "add_batch_ms_median_during": median(during, "addBatch"),
        "add_batch_ms_median_other": median(other, "addBatch"),
    }  # fmt: skip


def median_of(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


if __name__ == "__main__":
    main()
