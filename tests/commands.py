"""bergstream's command line run in the test's own process: the commands that a test expects to be refused
before Spark starts (a Spark session started by one of them fails the command, and the test), and those a
test runs whole on its own Spark session."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
from click.testing import CliRunner

from bergstream import spark as spark_module
from bergstream.catalog import CatalogConfig
from bergstream.cli import cli
from bergstream.errors import BergstreamError
from bergstream.router.driver import launch

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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


@dataclass(frozen=True)
class Ran:
    """A command run to its end, as `subprocess.run` reports one."""

    returncode: int
    stdout: str
    stderr: str


def run_in_process(spark: SparkSession, *arguments: str) -> Ran:
    """`bergstream ARGUMENTS` run to its end in the test's own process, on the test's Spark session instead
    of a driver of its own: for the commands a test runs whole and never kills (an audit, a publish, a
    router's `--available-now`), whose work takes a fraction of a driver's start. The command's catalog must
    be the session's, and any of bergstream's own Spark settings (spark.bergstream.*) it asks for set on the
    session alike: a command that needs a session of its own runs as a process. The session outlives the
    command."""
    from pyspark.sql import SparkSession as Session

    command = f"bergstream {' '.join(arguments)}"

    def shared(
        catalog: CatalogConfig, master: str = "", app_name: str = "", conf: Mapping[str, str] | None = None
    ) -> SparkSession:
        uri = spark.conf.get(f"spark.sql.catalog.{catalog.name}.uri", None)
        assert uri == catalog.uri, f"{command}: catalog {catalog.uri}, the session's {uri}"
        assert not master.startswith("spark://"), (
            f"{command}: master {master}, a cluster's: run it as a process"
        )
        differ = {
            key: value
            for key, value in (conf or {}).items()
            if key.startswith("spark.bergstream.") and spark.conf.get(key, None) != value
        }
        assert not differ, f"{command}: Spark settings {differ} the session has not: run it as a process"
        return spark

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    # As in a process of its own: the command's logging set up on a root logger without handlers, its lines
    # on the command's stderr.
    root.handlers[:] = []
    try:
        with pytest.MonkeyPatch.context() as patched:
            patched.setattr(spark_module, "build_spark_session", shared)
            patched.setattr(launch, "build_spark_session", shared)  # the router's drivers
            patched.setattr(Session, "stop", lambda _: None)
            result = CliRunner().invoke(cli, list(arguments))
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    error, stderr = result.exception, result.stderr
    if isinstance(error, BergstreamError):
        stderr += f"bergstream: error: {error}\n"  # as `bergstream` prints it (cli.main)
    elif error is not None and not isinstance(error, SystemExit):
        raise error
    return Ran(result.exit_code, result.stdout, stderr)


def run_whole(spark: SparkSession, command: list[str]) -> Ran:
    """A `[python, "-m", "bergstream", ...]` command, as tests write those they start as processes, run to its
    end by run_in_process instead."""
    assert command[1:3] == ["-m", "bergstream"], command
    return run_in_process(spark, *command[3:])
