"""Programs the tests build on first use, and the skip naming what is missing where they cannot be built."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bergstream.errors import MissingToolError


def built_with_go(build: Callable[[], Path]) -> Path:
    """The binary `build` makes with Go, or a skip naming the Go it needs where none of that version is on the
    PATH (an expected skip: tests/skips.py). A Go that is there and fails to build it fails the test."""
    try:
        return build()
    except MissingToolError as missing:
        pytest.skip(str(missing))
