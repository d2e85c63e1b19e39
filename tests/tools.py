"""The Go programs the tests build on first use: started in the background when the run begins, so that the
minutes of a first build pass beside the tests before the first one that needs it, and a skip naming what is
missing where they cannot be built."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from concurrent.futures import Future
from pathlib import Path

import pytest

from bergstream.errors import MissingToolError
from bergstream.local.go_install import PROMTOOL_3, GoProgram
from bergstream.local.object_store import VERSITYGW
from bergstream.local.schema_registry import SCHEMA_REGISTRY

# The fixture, and its parameter where it has one, that hands each program to the tests (conftest.py,
# test_object_store.py, test_schema_registry.py).
FIXTURES = {
    ("promtool", "3"): PROMTOOL_3,
    ("versitygw", None): VERSITYGW,
    ("registry_binary", None): SCHEMA_REGISTRY,
}

_builds: dict[GoProgram, Future[Path]] = {}


def needed_by(items: Iterable[pytest.Item]) -> list[GoProgram]:
    """The programs, in the order of the first test that needs each."""
    needed: list[GoProgram] = []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        fixtures = getattr(item, "fixturenames", ())
        for (fixture, param), program in FIXTURES.items():
            if fixture in fixtures and param in (None, params.get(fixture)) and program not in needed:
                needed.append(program)
    return needed


def build_in_background(programs: Iterable[GoProgram]) -> None:
    """Build those not built yet, one after another (each takes both cores), in a thread of the run's own."""
    pending = [program for program in programs if program not in _builds and not program.installed()]
    if not pending:
        return
    for program in pending:
        _builds[program] = Future()

    def build() -> None:
        for program in pending:
            future = _builds[program]
            try:
                future.set_result(program.install())
            except BaseException as error:  # handed to the test that waits for it
                future.set_exception(error)

    threading.Thread(target=build, name="go builds", daemon=True).start()


def built_with_go(program: GoProgram) -> Path:
    """The program's binary, once built (by the background build when it is under way), or a skip naming
    the Go it needs where none of that version is on the PATH (an expected skip: tests/skips.py). A Go that
    is there and fails to build it fails the test."""
    try:
        future = _builds.get(program)
        return future.result() if future is not None else program.install()
    except MissingToolError as missing:
        pytest.skip(str(missing))
