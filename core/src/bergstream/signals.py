"""SIGINT and SIGTERM (Ctrl-C, Kubernetes, a scheduler) stop bergstream's work cleanly, not kill it."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def on_stop_signals(stop: Callable[[], None]) -> Iterator[None]:
    """While inside, SIGINT and SIGTERM call `stop` (also where a shell started the process in the
    background with SIGINT ignored); the former handlers come back at the end. Python takes signals in the
    main thread only: elsewhere, nothing is installed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum: int, frame: Any) -> None:
        stop()

    previous = {signum: signal.signal(signum, handle) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
