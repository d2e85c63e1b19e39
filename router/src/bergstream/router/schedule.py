"""Maintenance inside the router: `router maintain` every `maintenance.every`, in a thread of the driver.

Compaction and snapshot expiry commit beside the router's appends; Iceberg retries whichever loses the race,
and expiry keeps what a restart needs (router/maintain.py). A run that fails (most often a compaction whose
commit lost the race more times than Iceberg retries it) is logged and counted, and tried again a minute
later, then after twice as long for each failure in a row, never later than its time: archiving never waits
for maintenance.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta

from pyspark.sql import SparkSession

from bergstream.errors import first_line
from bergstream.router.config import RouterConfig
from bergstream.router.maintain import maintain
from bergstream.router.maintenance_settings import MANY_SNAPSHOTS
from bergstream.router.metrics import RouterMetrics
from bergstream.router.retry import Backoff, java_causes
from bergstream.timeparse import format_duration

log = logging.getLogger("bergstream.router.maintenance")
# The wait before the first attempt after a failed run; it doubles with each failure in a row.
RETRY_AFTER_SECONDS = 60.0


def next_wait(every: float, failures_in_a_row: int) -> float:
    """Seconds until the next run: `every` after a run that succeeded, sooner after a failure."""
    if failures_in_a_row == 0:
        return every
    backoff = Backoff(initial_backoff_seconds=min(RETRY_AFTER_SECONDS, every), max_backoff_seconds=every)
    return backoff.delay(failures_in_a_row)


class MaintenanceSchedule:
    """Runs `maintain` every `config.settings.maintenance.every`, the first time one interval after
    `start`, and sooner after a run that failed (`next_wait`)."""

    def __init__(self, spark: SparkSession, config: RouterConfig, metrics: RouterMetrics) -> None:
        topic, every = config.settings.topic, config.settings.maintenance.every_seconds
        if every is None:
            raise ValueError(f"{topic}: maintenance.every is not set")
        self.spark = spark
        self.config = config
        self.topic = topic
        self.metrics = metrics
        self.every = every
        self._job_group = f"bergstream-maintenance-{topic}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=self._job_group, daemon=True)

    def start(self) -> None:
        settings = self.config.settings.maintenance
        log.info(
            "%s: maintenance every %s (snapshots kept %gh, at least %d)",
            self.topic, settings.every, self.config.snapshot_retention_hours,
            settings.retain_last_snapshots,
        )  # fmt: skip
        self._thread.start()

    def stop(self, timeout: float = 60) -> None:
        """Stop after the current run; a run still going after `timeout` has its Spark jobs cancelled."""
        self._stop.set()
        if not self._thread.is_alive():
            return
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("%s: cancelling the maintenance run still going", self.topic)
            self.spark.sparkContext.cancelJobGroup(self._job_group)
            self._thread.join(timeout)

    def _loop(self) -> None:
        self.spark.sparkContext.setJobGroup(self._job_group, "bergstream router maintenance", True)
        failures = 0
        while not self._stop.wait(next_wait(self.every, failures)):
            failures = 0 if self.run_once(failures) else failures + 1

    def run_once(self, failures_before: int = 0) -> bool:
        """One run; whether it succeeded. `failures_before`: the runs that failed in a row before it."""
        topic, metrics = self.topic, self.metrics
        started = time.monotonic()
        try:
            results = maintain(self.spark, self.config)
        except Exception as error:
            if self._stop.is_set():
                return False
            metrics.maintenance_runs.labels(topic, "failed").inc()
            causes = java_causes(error)  # the Java exception at the root says what went wrong
            retry = format_duration(timedelta(seconds=round(next_wait(self.every, failures_before + 1))))
            log.error("%s: maintenance failed, tried again in %s: %s", topic, retry,
                      causes[-1].line if causes else first_line(error))  # fmt: skip
            log.debug("maintenance of %s failed", topic, exc_info=True)
            return False
        seconds = time.monotonic() - started
        metrics.maintenance_runs.labels(topic, "done").inc()
        metrics.maintenance_duration.labels(topic).observe(seconds)
        metrics.maintenance_last_success.labels(topic).set(time.time())
        for result in results:  # each table's summary is logged by maintain
            metrics.maintenance_expired_snapshots.labels(topic, result.table).inc(result.expired_snapshots)
            metrics.maintenance_backfill_held_snapshots.labels(topic, result.table).set(len(result.held))
        every = self.config.settings.maintenance.every
        log.info("%s: maintenance done in %.1fs, next in %s", topic, seconds, every)
        return True


def warn_of_long_history(config: RouterConfig) -> None:
    """Say so when the snapshot retention keeps a long history at the router's trigger interval."""
    retained = config.snapshot_retention_hours * 3600 / max(config.query.trigger_seconds, 1e-3)
    if retained > MANY_SNAPSHOTS:
        log.warning(
            "%s: a commit every %s kept for %gh is about %d snapshots that every commit lists again; "
            "a shorter maintenance.snapshot_retention_hours keeps commits fast",
            config.settings.topic, config.query.trigger_interval, config.snapshot_retention_hours, retained,
        )  # fmt: skip


class RotatingMaintenance:
    """Maintenance of the many topics of one query (`router run --pattern`) by one thread: each topic every
    `maintenance.every` of its own settings, one topic at a time, so that hundreds of topics never compact
    at once; a topic whose run failed is tried again sooner, as MaintenanceSchedule does."""

    JOB_GROUP = "bergstream-maintenance"

    def __init__(
        self, spark: SparkSession, metrics: RouterMetrics, topics: Callable[[], list[RouterConfig]]
    ) -> None:
        self.spark = spark
        self.metrics = metrics
        self._topics = topics
        self._stop = threading.Event()
        # topic -> its schedule (never started: its runs are this thread's), when it is due, failures in a row
        self._due: dict[str, tuple[MaintenanceSchedule, float, int]] = {}
        self._thread = threading.Thread(target=self._loop, name=self.JOB_GROUP, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 60) -> None:
        self._stop.set()
        for schedule, _, _ in list(self._due.values()):
            schedule.stop()
        if not self._thread.is_alive():
            return
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("cancelling the maintenance run still going")
            self.spark.sparkContext.cancelJobGroup(self.JOB_GROUP)
            self._thread.join(timeout)

    def due(self, now: float) -> list[str]:
        """The topics whose maintenance is due at `now` (monotonic seconds), most overdue first; topics met
        for the first time are due one interval later."""
        for config in self._topics():
            every = config.settings.maintenance.every_seconds
            if every is not None and config.settings.topic not in self._due:
                self._due[config.settings.topic] = (
                    MaintenanceSchedule(self.spark, config, self.metrics),
                    now + every,
                    0,
                )
        return [
            topic for topic, (_, at, _) in sorted(self._due.items(), key=lambda item: item[1][1]) if at <= now
        ]

    def _loop(self) -> None:
        self.spark.sparkContext.setJobGroup(self.JOB_GROUP, "bergstream router maintenance", True)
        while not self._stop.is_set():
            for topic in self.due(time.monotonic()):
                if self._stop.is_set():
                    return
                schedule, _, failures = self._due[topic]
                failures = 0 if schedule.run_once(failures) else failures + 1
                self._due[topic] = (
                    schedule,
                    time.monotonic() + next_wait(schedule.every, failures),
                    failures,
                )
            upcoming = [at for _, at, _ in self._due.values()]
            wait = min(upcoming) - time.monotonic() if upcoming else 60.0
            self._stop.wait(min(max(wait, 1.0), 60.0))
