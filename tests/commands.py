"""bergstream's command line run in the test's own process, for the commands that a test expects to be
refused before Spark starts: a Spark session started by one of them fails the command, and the test."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from click.testing import CliRunner

from bergstream import spark as spark_module
from bergstream.cli import cli


@dataclass(frozen=True)
class Refusal:
    exit_code: int
    message: str  # what `bergstream` prints on stderr: the error's text


class SparkStarted(AssertionError):
    pass


def refused_before_spark(monkeypatch: pytest.MonkeyPatch, *arguments: str) -> Refusal:
    """`bergstream ARGUMENTS`, which must fail before it starts Spark: its exit code and its error."""

    def no_spark(*_: Any, **__: Any) -> Any:
        raise SparkStarted(f"bergstream {' '.join(arguments)} started Spark")

    with monkeypatch.context() as patched:
        patched.setattr(spark_module, "build_spark_session", no_spark)
        result = CliRunner().invoke(cli, list(arguments))
    error = result.exception
    assert not isinstance(error, SparkStarted), str(error)
    assert result.exit_code != 0, result.output
    message = result.output if error is None or isinstance(error, SystemExit) else str(error)
    return Refusal(result.exit_code, message)
