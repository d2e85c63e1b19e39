"""Long work's progress: a line per task on the terminal, or, without one, a log line every few seconds."""

from __future__ import annotations

import logging
import time
from typing import Any

LOG_EVERY_SECONDS = 10.0


class ProgressLines:
    """Tasks shown as rich progress lines while `show` (a terminal), else logged to `log` at most every
    `log_every` seconds each. With `percent`, a line has a bar and its percentage; else a spinner."""

    def __init__(
        self, log: logging.Logger, show: bool, percent: bool, log_every: float = LOG_EVERY_SECONDS
    ) -> None:
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._log = log
        self._show = show
        self._log_every = log_every
        self._started: dict[Any, float] = {}
        self._logged: dict[Any, float] = {}
        description, status = TextColumn("[bold]{task.description}"), TextColumn("{task.fields[status]}")
        columns: list[Any] = (
            [description, BarColumn(), TextColumn("{task.percentage:>5.1f}%"), status]
            if percent
            else [SpinnerColumn(), description, status, TimeElapsedColumn()]
        )
        self._bar = Progress(*columns, disable=not show, transient=False)

    def __enter__(self) -> ProgressLines:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._bar.__exit__(*exc)

    def add(self, description: str, status: str = "", percent: bool = False) -> Any:
        task = self._bar.add_task(description, total=100.0 if percent else None, status=status)
        self._started[task] = self._logged[task] = time.monotonic()
        return task

    def update(self, task: Any, status: str, percent: float | None = None) -> None:
        """The task's status (and percent done); logged too when there is no terminal and it is time."""
        self._bar.update(task, completed=percent, status=status)
        if not self._show and time.monotonic() - self._logged[task] >= self._log_every:
            description = self._bar.tasks[task].description
            elapsed = time.monotonic() - self._started[task]
            done = f" {percent:.1f}%" if percent is not None else ""
            self._log.info("%s: %.0fs%s %s", description, elapsed, done, status or "working")
            self._logged[task] = time.monotonic()

    def finish(self, task: Any, status: str) -> None:
        self._bar.update(task, total=1, completed=1, status=status)
