"""Where each micro-batch's addBatch went, from Spark's event log (bench/apps/run.py --event-log).

    .venv/bin/python -m bench.apps.eventlog bench/out/apps/events/<eventlog_v2_...>

A micro-batch's write is one SQL execution whose jobs carry the batch's id. Per query (its name and the
order it ran in), the medians over its micro-batches of:
- before jobs: from the execution's start to its first job (the write's planning on the driver);
- each stage of the jobs, by its position: wall time, tasks, and the tasks' run and CPU time summed;
- after jobs: from the last job's end to the execution's end: the sink's commit on the driver (for an
  Iceberg table, its new manifest, manifest list, metadata file and catalog commit).
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
from collections import defaultdict
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SQL_START = "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionStart"
SQL_END = "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionEnd"
QUERY_STARTED = "org.apache.spark.sql.streaming.StreamingQueryListener$QueryStartedEvent"


@dataclass
class Stage:
    submitted: int = 0
    completed: int = 0
    tasks: int = 0
    run_ms: int = 0
    cpu_ms: float = 0.0


@dataclass
class Execution:
    query_id: str = ""
    batch: int = -1
    started: int = 0
    ended: int = 0
    jobs: dict[int, tuple[int, int]] = field(default_factory=dict)  # id: (submitted, completed)
    stages: dict[int, Stage] = field(default_factory=dict)


def events(folder: Path) -> Iterator[dict[str, Any]]:
    """The events of an event log folder (version 2, rolled files, compressed with zstd or not)."""
    import zstandard

    for path in sorted(folder.glob("events_*"), key=lambda p: int(p.name.split("_")[1])):
        raw = path.read_bytes()
        if path.suffix == ".zstd":
            # Frames after frames, the last one maybe unfinished while Spark still writes the log.
            with zstandard.ZstdDecompressor().stream_reader(
                io.BytesIO(raw), read_across_frames=True
            ) as reader:
                chunks = []
                with suppress(zstandard.ZstdError):
                    while chunk := reader.read(1 << 20):
                        chunks.append(chunk)
            raw = b"".join(chunks)
        for line in raw.decode("utf-8", errors="replace").splitlines():
            try:
                yield json.loads(line)
            except ValueError:
                continue  # the last line of a log still being written


def executions(folder: Path) -> tuple[dict[str, str], list[Execution]]:
    """The queries' names by id, and the SQL executions of their micro-batches, in order."""
    names: dict[str, str] = {}
    by_id: dict[int, Execution] = {}
    job_execution: dict[int, int] = {}
    stage_execution: dict[int, int] = {}
    for event in events(folder):
        kind = event["Event"]
        if kind == QUERY_STARTED:
            names[event["id"]] = f"{len(names):02d} {event['name']}"
        elif kind == SQL_START:
            by_id[int(event["executionId"])] = Execution(started=int(event["time"]))
        elif kind == SQL_END and int(event["executionId"]) in by_id:
            by_id[int(event["executionId"])].ended = int(event["time"])
        elif kind == "SparkListenerJobStart":
            properties = event.get("Properties") or {}
            if "streaming.sql.batchId" not in properties or "spark.sql.execution.id" not in properties:
                continue
            execution = by_id.get(int(properties["spark.sql.execution.id"]))
            if execution is None:
                continue
            execution.query_id = properties["sql.streaming.queryId"]
            execution.batch = int(properties["streaming.sql.batchId"])
            job = int(event["Job ID"])
            job_execution[job] = int(properties["spark.sql.execution.id"])
            execution.jobs[job] = (int(event["Submission Time"]), 0)
            for stage in event["Stage IDs"]:
                stage_execution[int(stage)] = job_execution[job]
        elif kind == "SparkListenerJobEnd" and int(event["Job ID"]) in job_execution:
            execution = by_id[job_execution[int(event["Job ID"])]]
            submitted, _ = execution.jobs[int(event["Job ID"])]
            execution.jobs[int(event["Job ID"])] = (submitted, int(event["Completion Time"]))
        elif kind == "SparkListenerStageCompleted":
            info = event["Stage Info"]
            stage_id = int(info["Stage ID"])
            if stage_id in stage_execution and "Submission Time" in info:
                stage = by_id[stage_execution[stage_id]].stages.setdefault(stage_id, Stage())
                stage.submitted, stage.completed = int(info["Submission Time"]), int(info["Completion Time"])
        elif kind == "SparkListenerTaskEnd" and int(event["Stage ID"]) in stage_execution:
            stage = by_id[stage_execution[int(event["Stage ID"])]].stages.setdefault(
                int(event["Stage ID"]), Stage()
            )
            metrics = event.get("Task Metrics") or {}
            stage.tasks += 1
            stage.run_ms += int(metrics.get("Executor Run Time", 0))
            stage.cpu_ms += int(metrics.get("Executor CPU Time", 0)) / 1e6
    found = [e for e in by_id.values() if e.query_id and e.ended and all(c for _, c in e.jobs.values())]
    return names, found


def breakdown(folder: Path) -> dict[str, dict[str, float]]:
    """Per query, the medians over its micro-batches (those with jobs) of each part of the write."""
    names, found = executions(folder)
    per_query: dict[str, list[dict[str, float]]] = defaultdict(list)
    for execution in found:
        first = min(submitted for submitted, _ in execution.jobs.values())
        last = max(completed for _, completed in execution.jobs.values())
        parts: dict[str, float] = {
            "execution_ms": execution.ended - execution.started,
            "before_jobs_ms": first - execution.started,
            "jobs_ms": last - first,
            "after_jobs_ms": execution.ended - last,
        }
        for index, (_, stage) in enumerate(sorted(execution.stages.items())):
            parts[f"stage{index}_ms"] = stage.completed - stage.submitted
            parts[f"stage{index}_tasks"] = stage.tasks
            parts[f"stage{index}_task_run_ms"] = stage.run_ms
            parts[f"stage{index}_task_cpu_ms"] = stage.cpu_ms
        per_query[names.get(execution.query_id, execution.query_id)].append(parts)
    result = {}
    for name, batches in sorted(per_query.items()):
        keys = sorted({key for parts in batches for key in parts})
        result[name] = {"batches": len(batches)} | {
            key: statistics.median(parts.get(key, 0.0) for parts in batches) for key in keys
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folder", type=Path, help="an event log folder, eventlog_v2_<application id>")
    args = parser.parse_args()
    for name, medians in breakdown(args.folder).items():
        shown = ", ".join(f"{key.removesuffix('_ms')} {value:,.0f}" for key, value in medians.items())
        print(f"{name}: {shown}")


if __name__ == "__main__":
    main()
