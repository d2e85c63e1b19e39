"""Where an application's run is, from the progress events of its micro-batches: the batches and rows per
source, a backfill's epoch and watermark, a live run's Kafka offsets, and the phase of a bootstrap (the
archive, then Kafka from the batch of the switch on). The display shows it as it goes; the report says it at
the end.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from bergstream.backfill.read.planner import to_micros
from bergstream.runtime.checkpoint import RowLedger, offset_json
from bergstream.runtime.settings import AppSettings
from bergstream.timeparse import format_instant

if TYPE_CHECKING:
    from bergstream.backfill.read.planner import BackfillPlan

log = logging.getLogger("bergstream.backfill")


@dataclass
class Position:
    """Where a run is, from the progress of its micro-batches."""

    batches: int = 0
    rows: dict[str, int] = field(default_factory=dict)  # per source name
    epoch: int = 0
    epochs: int | None = None
    watermark: datetime | None = None  # every row ingested before it has been read
    # The application's own watermark, of event time (Spark's eventTime.watermark), once it has one.
    event_watermark: datetime | None = None
    kafka_end_offsets: dict[str, dict[int, int]] = field(default_factory=dict)  # live: next offset to read
    # A bootstrap: "archive", then "kafka" once its sources have switched (the batch of the switch on).
    phase: str | None = None
    switched_at_batch: int | None = None

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())


class RunTracker:
    """Follows the query's progress events; `position` is read by the display and the report."""

    def __init__(self, settings: AppSettings, ledger: RowLedger | None = None) -> None:
        # How each named source shows in a progress event's description, whatever order the plan has.
        self.markers = {
            name: (f"[{name}:", f"Subscribe[{source.topic}]") for name, source in settings.sources.items()
        }
        self.position = Position(rows=dict.fromkeys(settings.sources, 0))
        self.lock = threading.Lock()
        self.ledger = ledger

    def _name(self, description: str) -> str:
        for name, markers in self.markers.items():
            if any(marker in description for marker in markers):
                return name
        return description

    def on_progress(self, progress: Any) -> None:
        with self.lock:
            position = self.position
            position.batches += 1
            batch_rows: dict[str, int] = {}
            for source in progress.sources:
                name = self._name(str(source.description))
                batch_rows[name] = batch_rows.get(name, 0) + int(source.numInputRows)
                position.rows[name] = position.rows.get(name, 0) + int(source.numInputRows)
                end = offset_json(source.endOffset)
                if isinstance(end, dict) and end.get("phase") == "kafka":
                    if position.phase != "kafka":
                        position.phase = "kafka"
                        position.switched_at_batch = int(progress.batchId)
                        log.info("%s: switched to Kafka in batch %d", name, progress.batchId)
                    position.epoch = int(end.get("epochs", position.epoch))
                    for topic, partitions in end.get("kafka", {}).items():
                        position.kafka_end_offsets[topic] = {int(p): int(o) for p, o in partitions.items()}
                elif isinstance(end, dict) and "epoch" in end:
                    if end.get("phase") == "archive":
                        position.phase = position.phase or "archive"
                    position.epoch = int(end["epoch"])
                    position.epochs = int(end.get("epochs", 0)) or position.epochs
                    if end.get("watermark"):
                        position.watermark = datetime.fromisoformat(end["watermark"].replace("Z", "+00:00"))
                elif isinstance(end, dict):
                    for topic, partitions in end.items():
                        position.kafka_end_offsets[topic] = {int(p): int(o) for p, o in partitions.items()}
            event_watermark = (progress.eventTime or {}).get("watermark")
            if event_watermark and not event_watermark.startswith("1970-01-01T00:00:00"):
                position.event_watermark = datetime.fromisoformat(event_watermark.replace("Z", "+00:00"))
            if self.ledger is not None:
                self.ledger.record(int(progress.batchId), batch_rows)

    def status(self, plan: BackfillPlan | None, elapsed: float) -> tuple[str, float]:
        """The line shown for the run: percent of the window, rows/s, watermark, ETA; and the percent."""
        with self.lock:
            position = self.position
            rows, watermark, epoch = position.total_rows, position.watermark, position.epoch
            position = replace(position)
        rate = rows / elapsed if elapsed > 0 else 0.0
        if position.phase == "kafka":
            return (
                f"Kafka (switched in batch {position.switched_at_batch}), {rows:,} rows, {rate:,.0f} rows/s",
                100.0,
            )
        if plan is None or watermark is None:
            return f"{rows:,} rows, {rate:,.0f} rows/s", 0.0
        window = plan.window
        done = (to_micros(watermark) - window.start) / (window.end - window.start)
        remaining = sum(e.estimated_rows for e in plan.epochs[epoch:])
        eta = f"ETA {remaining / rate:,.0f}s" if rate > 0 and remaining else "ETA -"
        line = (
            f"epoch {epoch}/{len(plan.epochs)}, watermark {format_instant(watermark)}, "
            f"{rows:,} rows, {rate:,.0f} rows/s, {eta}"
        )
        return line, 100.0 * min(max(done, 0.0), 1.0)
