"""A micro-batch's progress reaches bergstream as Spark's JSON of it, each source's offsets as JSON text, the
way PySpark's own listener gives them, for every query of the session while the block runs."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from bergstream.query import progress_events, progress_from_json

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SPARK_JSON = {
    "id": "7c5e5f8e-8f55-4d4f-9f0f-8a4b2e3c1d10",
    "runId": "0b6bdfb1-4a53-4d55-9d77-2a6f3d2f1e21",
    "name": "bergstream-app-sessionizer-bootstrap",
    "timestamp": "2026-11-26T10:00:00.000Z",
    "batchId": 3,
    "batchDuration": 812,
    "numInputRows": 25000,
    "durationMs": {"addBatch": 700, "queryPlanning": 30, "triggerExecution": 812},
    "stateOperators": [{"operatorName": "sessionWindowStateStoreSaveExec", "numRowsTotal": 9,
                        "numRowsUpdated": 4, "allUpdatesTimeMs": 1, "numRowsRemoved": 0,
                        "allRemovalsTimeMs": 0, "commitTimeMs": 14, "memoryUsedBytes": 100,
                        "numRowsDroppedByWatermark": 0,
                        "numShufflePartitions": 2, "numStateStoreInstances": 2, "customMetrics": {}}],
    "sources": [{"description": "bergstream-hybrid[playback: playback]", "numInputRows": 25000,
                 "inputRowsPerSecond": 1.0, "processedRowsPerSecond": 2.0,
                 "startOffset": {"phase": "archive", "epoch": 2, "epochs": 17},
                 "endOffset": {"phase": "kafka", "epochs": 17, "kafka": {"playback": {"0": 12}}},
                 "latestOffset": None, "metrics": {}}],
    "sink": {"description": "bergstream.apps.bench", "numOutputRows": 10},
}  # fmt: skip


def test_a_progress_is_read_from_its_json_with_offsets_as_json_text() -> None:
    progress = progress_from_json(json.dumps(SPARK_JSON))
    assert progress.batchId == 3 and progress.numInputRows == 25000
    assert progress.durationMs["addBatch"] == 700
    assert progress.stateOperators[0].commitTimeMs == 14
    source = progress.sources[0]
    assert source.description == "bergstream-hybrid[playback: playback]"
    assert json.loads(source.endOffset) == SPARK_JSON["sources"][0]["endOffset"]  # type: ignore[index]
    assert '"phase":"kafka"' in source.endOffset
    assert json.loads(source.startOffset)["epoch"] == 2


@pytest.mark.integration
def test_every_batch_of_the_sessions_queries_reaches_the_block(spark: SparkSession, tmp_path: Path) -> None:
    seen: list[Any] = []
    two = threading.Event()

    def on_progress(progress: Any) -> None:
        seen.append(progress)
        if len(seen) >= 2:
            two.set()

    frame = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 10).load()
    with progress_events(spark, on_progress):
        query = (
            frame.writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(processingTime="100 milliseconds")
            .start()
        )
        try:
            assert two.wait(60), "no progress reached the block"
        finally:
            query.stop()
    counted = len(seen)
    assert all(str(progress.id) == query.id for progress in seen)
    assert [progress.batchId for progress in seen[:2]] == [0, 1]
    assert seen[1].numInputRows == 10
    assert json.loads(seen[1].sources[0].endOffset) is not None
    # Out of the block, the session's queries report to it no more.
    again = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 1).load()
    other = again.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "other")).start()
    try:
        deadline = time.monotonic() + 60
        while other.lastProgress is None and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        other.stop()
    assert other.lastProgress is not None
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
    assert len(seen) == counted
