"""What a redrive is doing and how far its Spark stages are."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pyspark.sql import SparkSession

from bergstream.progress_lines import LOG_EVERY_SECONDS, ProgressLines

log = logging.getLogger("bergstream.router.redrive")


class RedriveProgress:
    """What the redrive is doing and how far its Spark stages are: on the terminal, or every
    `log_every` seconds in the log when there is no terminal."""

    def __init__(self, session: SparkSession, show: bool, log_every: float = LOG_EVERY_SECONDS) -> None:
        self._tracker = session.sparkContext.statusTracker()
        self._lines = ProgressLines(log, show, percent=False, log_every=log_every)

    def __enter__(self) -> RedriveProgress:
        self._lines.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._lines.__exit__(*exc)

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
        task = self._lines.add(description)
        stop = threading.Event()

        def follow() -> None:
            while not stop.wait(0.5):
                self._lines.update(task, self._status())

        follower = threading.Thread(target=follow, name="bergstream-redrive-progress", daemon=True)
        follower.start()
        try:
            yield
        finally:
            stop.set()
            follower.join()
            self._lines.finish(task, "done")
