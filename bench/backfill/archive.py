"""The archives the backfill figures are measured on, both topics made by the router, in three shapes.

Impressions and playbacks are produced into a local broker with ingestion times spread over past hours
(impressions at ten times the playbacks, as in the talk's attribution application), archived by the
router with an availableNow trigger, then compacted by `router maintain`, as a day-old archive is. Kafka
keeps every record too, so that the same window can be replayed from Kafka. Each shape's stack is kept in
`bench/out/backfill/<shape>/stack` and reused while it holds the same request:

- `sparse`: 5,000,000 impressions and 500,000 playbacks over 24 hours (57,000 rows per 15 minutes);
- `4h`: 4,000,000 impressions and 400,000 playbacks over 4 hours (275,000 rows per 15 minutes);
- `dense`: 24,000,000 impressions and 2,400,000 playbacks over 6 hours (1,100,000 rows per 15 minutes),
  production density.

The tables have the router's own properties; `row_group_bytes` sets `write.parquet.row-group-size-bytes`
before compaction where a bench measures another row-group size.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.local import LocalStack, StackConfig
from bergstream.local.processes import free_ports
from bergstream.router.config import RouterConfig
from bergstream.router.driver.launch import archive_available_now
from bergstream.router.maintain import maintain
from bergstream.schemas.archive import DEAD_LETTER_SUFFIX
from bergstream.spark import build_spark_session
from bergstream.timeparse import format_instant

log = logging.getLogger("bench.backfill")
ROW_GROUP_BYTES = "write.parquet.row-group-size-bytes"
OUT = Path(__file__).parent.parent / "out" / "backfill"
PARTITIONS = 4
ENCODING = {"impression": "avro", "playback": "json"}
# The region each topic's router stamps: a bootstrap pins the hand-over of its source's region.
CLUSTERS = {"impression": "eu-west-1", "playback": "us-east-1"}


@dataclass(frozen=True)
class ArchiveRequest:
    impressions: int
    playbacks: int
    start: str  # ISO, the first ingestion hour
    hours: int = 24
    compact: bool = True
    late_fraction: float = 0.05
    # None: the router's own row-group size.
    row_group_bytes: int | None = None

    @property
    def counts(self) -> dict[str, int]:
        return {"impression": self.impressions, "playback": self.playbacks}


@dataclass(frozen=True)
class BenchArchive:
    stack: LocalStack
    request: ArchiveRequest
    bootstrap_servers: str

    @property
    def start(self) -> datetime:
        return datetime.fromisoformat(self.request.start)

    @property
    def end(self) -> datetime:
        return self.start + timedelta(hours=self.request.hours)

    def config(self, topic: str, checkpoint: Path) -> RouterConfig:
        return RouterConfig.flat(
            topic=topic,
            schema=topic,
            encoding=ENCODING[topic],  # type: ignore[arg-type]
            table=topic,
            cluster=CLUSTERS[topic],
            kafka={"kafka.bootstrap.servers": self.bootstrap_servers, "startingOffsets": "earliest"},
            max_offsets_per_trigger=500_000,
            checkpoint_location=str(checkpoint),
            catalog=self.stack.config.catalog,
        )


SHAPES: dict[str, tuple[int, int, int]] = {
    # name: impressions, playbacks, hours
    "sparse": (5_000_000, 500_000, 24),
    "4h": (4_000_000, 400_000, 4),
    "dense": (24_000_000, 2_400_000, 6),
}


def shape_request(shape: str, row_group_bytes: int | None = None) -> ArchiveRequest:
    impressions, playbacks, hours = SHAPES[shape]
    return ArchiveRequest(
        impressions, playbacks, default_start(hours), hours, row_group_bytes=row_group_bytes
    )


def shape_home(shape: str) -> Path:
    return OUT / shape / "stack"


def default_start(hours: int) -> str:
    """The day that ended at the last whole hour: recent enough for Kafka's retention to keep it."""
    end = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    return format_instant(end - timedelta(hours=hours))


def build(request: ArchiveRequest, home: Path) -> BenchArchive:
    """The archive of `request`, built once: a later call with the same request reuses it."""
    recipe = home / "archive.json"
    if recipe.exists():
        made = ArchiveRequest(**json.loads(recipe.read_text()))
        # The same archive made on another day serves as well: only its start differs.
        if asdict(made) | {"start": request.start} == asdict(request):
            stack = LocalStack.at(home)
            status = stack.status() if stack.status().running else stack.up()
            print(f"reusing the archive in {home}: {made}")
            return BenchArchive(stack, made, status.bootstrap_servers)
    leftover = LocalStack.at(home)
    if leftover.status().running:
        leftover.down()
    import shutil

    shutil.rmtree(home, ignore_errors=True)
    kafka_port, controller_port = free_ports(2)
    stack = LocalStack(StackConfig(data_dir=home, kafka_port=kafka_port, controller_port=controller_port))
    status = stack.up()
    archive = BenchArchive(stack, request, status.bootstrap_servers)
    start = datetime.fromisoformat(request.start)
    for topic, count in request.counts.items():
        began = time.monotonic()
        report = produce(
            ProduceRequest(
                topic=topic, count=count, partitions=PARTITIONS, late_fraction=request.late_fraction,
                encoding=ENCODING[topic],  # type: ignore[arg-type]
                seed=3, ingestion_start=start, ingestion_span=timedelta(hours=request.hours),
            ),
            status.bootstrap_servers,
            show_progress=count >= 1_000_000,
        )  # fmt: skip
        print(f"produced {report.sent:,} {topic} events in {time.monotonic() - began:.0f}s")
    spark = build_spark_session(stack.config.catalog, app_name="bench-backfill-archive")
    try:
        for topic in request.counts:
            began = time.monotonic()
            totals = archive_available_now(spark, archive.config(topic, home / "checkpoints" / topic))
            print(f"archived {totals.archived:,} {topic} rows in {totals.files} files, "
                  f"{time.monotonic() - began:.0f}s")  # fmt: skip
            if request.compact:
                for table in (topic, f"{topic}{DEAD_LETTER_SUFFIX}") if request.row_group_bytes else ():
                    spark.sql(f"ALTER TABLE {stack.config.catalog.table_identifier(table)} SET TBLPROPERTIES "
                              f"('{ROW_GROUP_BYTES}' = '{request.row_group_bytes}')")  # fmt: skip
                for result in maintain(spark, archive.config(topic, home / "checkpoints" / topic)):
                    print(result.summary())
    finally:
        spark.stop()
    recipe.write_text(json.dumps(asdict(request)))
    return archive


def relayout(spark: Any, archive: BenchArchive, row_group_bytes: int) -> None:
    """Rewrite both tables' files, sorted as compaction sorts them, into row groups of `row_group_bytes`
    (`write.parquet.row-group-size-bytes`); a no-op when they already have that size."""
    catalog = archive.stack.config.catalog
    for table in archive.request.counts:
        identifier = catalog.table_identifier(table)
        properties = {row.key: row.value for row in spark.sql(f"SHOW TBLPROPERTIES {identifier}").collect()}
        if properties.get(ROW_GROUP_BYTES) == str(row_group_bytes):
            continue
        began = time.monotonic()
        spark.sql(f"ALTER TABLE {identifier} SET TBLPROPERTIES ('{ROW_GROUP_BYTES}' = '{row_group_bytes}')")
        spark.sql(
            f"CALL {catalog.name}.system.rewrite_data_files(table => '{identifier}', strategy => 'sort', "
            f"options => map('rewrite-all', 'true', 'target-file-size-bytes', '{512 * 1024 * 1024}'))"
        )
        print(f"{identifier}: rewritten into row groups of {row_group_bytes:,} bytes in "
              f"{time.monotonic() - began:.0f}s")  # fmt: skip


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", choices=list(SHAPES), default="sparse")
    parser.add_argument("--row-group-bytes", type=int, default=None, help="default: the router's own")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    build(shape_request(args.shape, args.row_group_bytes), shape_home(args.shape))
