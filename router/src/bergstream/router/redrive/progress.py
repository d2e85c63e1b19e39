"""What a redrive is doing and how far its Spark stages are."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pyspark.sql import SparkSession

log = logging.getLogger("bergstream.router.redrive")


class RedriveProgress:
    """What the redrive is doing and how far its Spark stages are: on the terminal, or every
    `log_every` seconds in the log when there is no terminal."""

    def __init__(self, session: SparkSession, show: bool, log_every: float = 10.0) -> None:
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._tracker = session.sparkContext.statusTracker()
        self._show = show
        self._log_every = log_every
        self._bar = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            disable=not show,
            transient=False,
        )

    def __enter__(self) -> RedriveProgress:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._bar.__exit__(*exc)

    def _status(self) -> str:
        total = done = 0
        for stage_id in self._tracker.getActiveStageIds():
            stage = self._tracker.getStageInfo(stage_id)
            if stage is not None:
                total += stage.numTasks
                done += stage.numCompletedTasks
        return f"tasks {done}/{total}" if total else ""

    @contextmanager
    def phase(self, description: str) -> Iterator[None]:
        task = self._bar.add_task(description, total=None, status="")
        stop = threading.Event()
        started = time.monotonic()

        def follow() -> None:
            last_log = started
            while not stop.wait(0.5):
                status = self._status()
                self._bar.update(task, status=status)
                if not self._show and time.monotonic() - last_log >= self._log_every:
                    log.info("%s: %.0fs, %s", description, time.monotonic() - started, status or "working")
                    last_log = time.monotonic()

        follower = threading.Thread(target=follow, name="bergstream-redrive-progress", daemon=True)
        follower.start()
        try:
            yield
        finally:
            stop.set()
            follower.join()
            self._bar.update(task, total=1, completed=1, status="done")
