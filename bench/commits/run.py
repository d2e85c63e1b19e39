"""bench/commits: what one Iceberg commit of the router costs as its archive table ages.

A router on a 1-second trigger commits 3,600 times an hour. Every commit writes a metadata file that lists
the retained snapshots and the log of earlier metadata files, and a manifest list naming the snapshot's
manifests. This bench appends to an archive table made as the router makes it (`ensure_tables`, an
`ArchiveLayout`) on the embedded stack's catalog (SQLite JDBC catalog, local warehouse) and reports, per
window of commits, the commit latency (p50, p99) and the size of the table's metadata: the current
metadata.json, the metadata files on disk, the manifests of the current snapshot, the snapshots retained.

  1. `--router-appends` real router appends: the router (`archive_available_now`) reads one record per
     micro-batch from Kafka and appends it with Spark (`writeTo(...).append()`, the batch's snapshot
     properties). Latency: the whole append, Spark job included.
  2. Then up to `--commits`, the same Iceberg operation from the driver's JVM: Spark's append is
     `Table.newAppend()`, Iceberg's merge append; here each commit appends a copy of a real data file of
     the table (`DataFiles.builder(spec).copy(...)`) with the same snapshot properties. Latency: the commit.

`--variant before` runs with the table properties of the router before its metadata was bounded and no
maintenance; the metadata files Iceberg leaves behind are deleted by the bench past the newest 100, to
spare the disk (their number and bytes are still counted). `--variant after` runs with the router's table
properties and, every `--maintain-every-commits` commits (an hour of a 1-second trigger), `router maintain`
(`router.maintain.maintain`) as the router's schedule runs it, its clock moved so that the snapshots older
than `--retention-commits` commits ago are past the retention of an hour.

    nice -n 10 .venv/bin/python -m bench.commits.run --variant before [--commits 20000] \
        [--router-appends 2000]
    nice -n 10 .venv/bin/python -m bench.commits.run --variant after
    .venv/bin/python -m bench.commits.run --plot-only

Writes bench/out/commits/<variant>.json and bench/out/commits/commits.png (both variants, when both ran).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from bench.router.run import machine, percentile
from bench.stack import bench_parser, throwaway_stack
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.router import archive_tables
from bergstream.router.config import RouterConfig
from bergstream.router.driver.launch import archive_available_now
from bergstream.router.maintain import maintain
from bergstream.router.maintenance_settings import MaintenanceSettings
from bergstream.router.write import BATCH_ID, QUERY_ID, Appended, BatchTableWriter
from bergstream.spark import build_spark_session

OUT = Path(__file__).parent.parent / "out" / "commits"
TOPIC = "playback"
# The metadata files a table keeps in its log by default; the bench deletes older ones in the `before` run.
KEPT_METADATA_FILES = 101


def local_path(location: str) -> Path:
    return Path(location.removeprefix("file:").removeprefix("//"))


class Table:
    """The archive table as the driver's JVM sees it: Iceberg's own Table, through py4j."""

    def __init__(self, spark: SparkSession, identifier: str) -> None:
        self.spark = spark
        self.jvm: Any = spark._jvm
        assert self.jvm is not None
        self.identifier = identifier
        self.table: Any = self.jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
            spark._jsparkSession, identifier
        )

    def refresh(self) -> None:
        self.table.refresh()

    def metadata_dir(self) -> Path:
        return local_path(self.table.operations().current().metadataFileLocation()).parent

    def state(self) -> dict[str, Any]:
        """The size of the table's metadata now."""
        table, jvm = self.table, self.jvm
        current = local_path(table.operations().current().metadataFileLocation())
        snapshot = table.currentSnapshot()
        metadata_dir = current.parent
        metadata_files = list(metadata_dir.glob("*.metadata.json"))
        return {
            "metadata_json_bytes": current.stat().st_size,
            "metadata_files": len(metadata_files),
            "metadata_dir_bytes": sum(p.stat().st_size for p in metadata_dir.iterdir() if p.is_file()),
            "manifests": snapshot.allManifests(table.io()).size(),
            "manifest_list_bytes": local_path(snapshot.manifestListLocation()).stat().st_size,
            "snapshots": jvm.org.apache.iceberg.relocated.com.google.common.collect.Iterables.size(
                table.snapshots()
            ),
            "data_files": int(snapshot.summary().get("total-data-files")),
        }

    def template_file(self, keep: Path) -> Any:
        """A data file the router appended, the one the current snapshot added, its content kept in `keep`:
        maintenance deletes the table's own file once compaction replaced it and expiry let it go."""
        template = self.table.currentSnapshot().addedDataFiles(self.table.io()).iterator().next()
        shutil.copyfile(local_path(template.location()), keep)
        return template

    def append_copy(self, template: Any, content: Path, number: int, query_id: str, batch_id: int) -> float:
        """Append a copy of `content` described as `template`, as Spark's append does; seconds the commit
        took."""
        source = local_path(template.location())
        copy = source.with_name(f"bench-{number:06d}-{source.name}")
        shutil.copyfile(content, copy)
        data_file = (
            self.jvm.org.apache.iceberg.DataFiles.builder(self.table.spec())
            .copy(template)
            .withPath(str(copy))
            .build()
        )
        started = time.monotonic()
        (
            self.table.newAppend()
            .appendFile(data_file)
            .set(QUERY_ID, query_id)
            .set(BATCH_ID, str(batch_id))
            .set("spark.app.id", self.spark.sparkContext.applicationId)
            .commit()
        )
        return time.monotonic() - started

    def prune_metadata_files(self) -> tuple[int, int]:
        """Delete the metadata files past the newest KEPT_METADATA_FILES; (files, bytes) deleted."""
        files = sorted(self.metadata_dir().glob("*.metadata.json"), key=lambda p: p.name)
        old = files[:-KEPT_METADATA_FILES]
        size = sum(p.stat().st_size for p in old)
        for path in old:
            path.unlink()
        return len(old), size


class Windows:
    """Commit latencies gathered into windows, each closed with the table's state."""

    def __init__(self, size: int, variant: str, save: Callable[[list[dict[str, Any]]], None]) -> None:
        self.size = size
        self.save = save
        self.table: Table | None = None
        self.variant = variant
        self.latencies: list[float] = []
        self.commits = 0
        self.rows: list[dict[str, Any]] = []
        self.pruned_files = 0
        self.pruned_bytes = 0
        self.started = time.monotonic()

    def add(self, seconds: float, phase: str) -> None:
        self.latencies.append(seconds)
        self.commits += 1
        if len(self.latencies) >= self.size:
            self.close(phase)

    def close(self, phase: str) -> None:
        if not self.latencies or self.table is None:
            return
        self.table.refresh()
        state = self.table.state()
        if self.variant == "before":
            files, size = self.table.prune_metadata_files()
            self.pruned_files += files
            self.pruned_bytes += size
        row = {
            "commits": self.commits,
            "phase": phase,
            "p50_ms": percentile(self.latencies, 50) * 1000,
            "p99_ms": percentile(self.latencies, 99) * 1000,
            "mean_ms": statistics.mean(self.latencies) * 1000,
            **state,
            "metadata_files_deleted_by_bench": self.pruned_files,
            "metadata_bytes_deleted_by_bench": self.pruned_bytes,
            "elapsed_s": time.monotonic() - self.started,
            "load_average": os.getloadavg()[0],
        }
        self.rows.append(row)
        self.save(self.rows)
        self.latencies = []
        print(
            f"{self.variant} {phase} {self.commits:>6} commits: p50 {row['p50_ms']:.0f} ms, "
            f"p99 {row['p99_ms']:.0f} ms, metadata.json {row['metadata_json_bytes'] / 1e6:.2f} MB, "
            f"{row['metadata_files']} metadata files, {row['manifests']} manifests, "
            f"{row['snapshots']} snapshots, {row['data_files']} data files "
            f"({row['elapsed_s']:.0f}s, load {row['load_average']:.1f})",
            flush=True,
        )


def router_appends(spark: SparkSession, config: RouterConfig, windows: Windows) -> tuple[str, int]:
    """Run the router over the topic, one record per batch; (query id, last batch id) of its appends."""
    original = BatchTableWriter.append
    archive = config.query.catalog.table_identifier(config.settings.table)
    seen: dict[str, Any] = {}

    def timed(writer: BatchTableWriter, rows: DataFrame, batch_id: int) -> Appended | None:
        started = time.monotonic()
        result = original(writer, rows, batch_id)
        if writer.identifier == archive and result is not None:
            if windows.table is None:
                windows.table = Table(spark, archive)
            windows.add(time.monotonic() - started, "router")
            seen["query"], seen["batch"] = writer.query_id, batch_id
        return result

    BatchTableWriter.append = timed  # type: ignore[method-assign,assignment]
    try:
        archive_available_now(spark, config)
    finally:
        BatchTableWriter.append = original  # type: ignore[method-assign]
    windows.close("router")
    return str(seen["query"]), int(seen["batch"])


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--variant", choices=("before", "after"))
    parser.add_argument("--commits", type=int, default=20_000, help="commits in all")
    parser.add_argument("--router-appends", type=int, default=2_000, help="of which real router appends")
    parser.add_argument("--window", type=int, default=500, help="commits per window of the report")
    parser.add_argument("--maintain-every-commits", type=int, default=3_600)
    parser.add_argument("--retention-commits", type=int, default=3_600)
    parser.add_argument("--plot-only", action="store_true", help="plot the JSON of earlier runs")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    if args.plot_only:
        plot()
        return
    if args.variant is None:
        parser.error("--variant before or --variant after")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("bergstream.router.maintain").setLevel(logging.INFO)
    variant = args.variant
    if variant == "before":
        # The router as it was: no properties bounding metadata, manifests or snapshots.
        archive_tables.maintained_properties = lambda config: {}  # type: ignore[attr-defined]
    with throwaway_stack("commits") as (stack, status, home):
        results: dict[str, Any] = {
            "variant": variant,
            "machine": machine(),
            "date": datetime.now(UTC).isoformat(),
            "commits": args.commits,
            "router_appends": args.router_appends,
            "maintain_every_commits": args.maintain_every_commits if variant == "after" else None,
            "retention_commits": args.retention_commits if variant == "after" else None,
            "nice": os.nice(0),
            "windows": [],
        }
        maintenance: list[dict[str, Any]] = []
        produce(
            ProduceRequest(topic=TOPIC, count=args.router_appends, partitions=1, seed=1),
            status.bootstrap_servers,
            show_progress=False,
        )
        catalog = stack.config.catalog
        spark = build_spark_session(
            catalog, master="local[2]", app_name="bench-commits", conf={"spark.ui.enabled": "false"}
        )
        try:
            config = RouterConfig.flat(
                topic=TOPIC,
                schema=TOPIC,
                encoding="json",
                table=TOPIC,
                kafka={"kafka.bootstrap.servers": status.bootstrap_servers, "startingOffsets": "earliest"},
                checkpoint_location=str(home / "checkpoints" / TOPIC),
                catalog=catalog,
                max_offsets_per_trigger=1,
                trigger_interval="1 second",
                maintenance=MaintenanceSettings(snapshot_retention_hours=1),
            )

            # The router creates its tables; the bench reads them once they exist.
            def save(rows: list[dict[str, Any]]) -> None:
                """What is measured so far: a run cut short still reports."""
                results["windows"], results["maintenance"] = rows, maintenance
                (OUT / f"{variant}.json").write_text(json.dumps(results, indent=2))

            windows = Windows(args.window, variant, save)
            print(f"{variant}: {args.router_appends:,} router appends of one record each", flush=True)
            query_id, batch_id = router_appends(spark, config, windows)
            table = windows.table
            assert table is not None
            content = home / "template.parquet"
            template = table.template_file(content)
            committed_at: list[float] = []
            print(f"{variant}: appends from the driver's JVM up to {args.commits:,} commits", flush=True)
            for number in range(windows.commits, args.commits):
                batch_id += 1
                windows.add(table.append_copy(template, content, number, query_id, batch_id), "jvm")
                committed_at.append(time.time())
                done = number + 1
                if variant == "after" and done % args.maintain_every_commits == 0:
                    maintenance.append(
                        maintain_now(spark, config, committed_at, args.retention_commits, done)
                    )
                    table.refresh()
            windows.close("jvm")
        finally:
            spark.stop()
    (OUT / f"{variant}.json").write_text(json.dumps(results, indent=2))
    print(f"wrote {OUT / f'{variant}.json'}")
    plot()


def maintain_now(
    spark: SparkSession, config: RouterConfig, committed_at: list[float], retention: int, done: int
) -> dict[str, Any]:
    """`router maintain` with its clock set so that commits older than `retention` commits are an hour
    and more old: what an hour of a 1-second trigger leaves to expire."""
    oldest_kept = committed_at[-retention] if len(committed_at) >= retention else committed_at[0]
    now = datetime.fromtimestamp(oldest_kept, UTC) + timedelta(hours=config.snapshot_retention_hours)
    started = time.monotonic()
    results = maintain(spark, config, now=now)
    seconds = time.monotonic() - started
    archive = results[0]
    print(f"maintenance after {done} commits in {seconds:.1f}s: {archive.summary()}", flush=True)
    return {
        "commits": done,
        "seconds": seconds,
        "expired_snapshots": archive.expired_snapshots,
        "rewritten_files": archive.rewritten_files,
    }


def plot() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {
        variant: json.loads((OUT / f"{variant}.json").read_text())
        for variant in ("before", "after")
        if (OUT / f"{variant}.json").exists()
    }
    if not runs:
        return
    figure, axes = plt.subplots(2, 2, figsize=(11, 7))
    colors = {"before": "#c33", "after": "#2a7"}
    panels = (
        (axes[0][0], "p50_ms", "commit latency p50 (ms)"),
        (axes[0][1], "metadata_json_bytes", "current metadata.json (bytes)"),
        (axes[1][0], "manifests", "manifests of the current snapshot"),
        (axes[1][1], "snapshots", "snapshots retained"),
    )
    for variant, run in runs.items():
        rows = run["windows"]
        commits = [row["commits"] for row in rows]
        for axis, key, title in panels:
            axis.plot(commits, [row[key] for row in rows], color=colors[variant], label=variant)
            axis.set_title(title, fontsize=9)
            axis.set_xlabel("commits")
        axes[0][0].plot(
            commits,
            [row["p99_ms"] for row in rows],
            color=colors[variant],
            linestyle=":",
            label=f"{variant} p99",
        )
    axes[0][0].set_yscale("log")
    for axis, _, _ in panels:
        axis.legend(fontsize=8)
    first = next(iter(runs.values()))
    figure.suptitle(
        f"Router commits to one archive table ({first['machine']}); the first window of each run is "
        "Spark appends of the router, the rest the same Iceberg append from the driver's JVM",
        fontsize=9,
    )
    figure.tight_layout()
    path = OUT / "commits.png"
    figure.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
