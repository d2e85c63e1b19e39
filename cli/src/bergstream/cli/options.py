"""Options and output shared by the commands."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from bergstream.errors import BergstreamError

DATA_DIR = click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the local stack keeps its state (default: $BERGSTREAM_HOME or ./.bergstream).",
)
TABLE = click.option(
    "--table", default=None, help="Archive table (default: from the topic's file, else the topic's name)."
)
CLIENT_CONFIG = click.option(
    "--client-config",
    "--command-config",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Kafka client settings, Java client names (security.protocol, sasl.jaas.config, ...), as a "
    "properties file (default: the site's kafka settings, else the local stack's producer).",
)
SPARK_CONF = click.option(
    "--conf",
    "spark_conf",
    multiple=True,
    metavar="KEY=VALUE",
    help="A Spark setting, as spark-submit takes it (spark.sql.shuffle.partitions=4), over the settings "
    "file's spark.conf; repeatable.",
)


def key_values(pairs: tuple[str, ...], flag: str) -> dict[str, str]:
    """The settings of a repeatable `flag KEY=VALUE`; a pair without `=` or key is refused, naming it."""
    settings: dict[str, str] = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key.strip():
            raise click.BadParameter(f"{pair!r}: write KEY=VALUE", param_hint=flag)
        settings[key.strip()] = value
    return settings


def spark_overrides(pairs: tuple[str, ...]) -> dict[str, Any] | None:
    """The `spark:` settings of `--conf KEY=VALUE` flags, to lay over a settings file's; None without any."""
    conf = key_values(pairs, "--conf")
    return {"conf": conf} if conf else None


ROUTER_CONFIG = click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Settings file (default: <topics dir>/<topic>.yaml; see --topics-dir).",
)
TOPICS_DIR = click.option(
    "--topics-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the topics' <topic>.yaml files are (default: $BERGSTREAM_TOPICS_DIR, else the site "
    "settings' topics_dir, else deploy/topics).",
)

_Command = TypeVar("_Command", bound=Callable[..., Any])


def with_options(options: list[Callable[[Any], Any]]) -> Callable[[_Command], _Command]:
    """Several click options at once, in the order listed."""

    def decorate(function: _Command) -> _Command:
        for option in reversed(options):
            function = option(function)
        return function

    return decorate


def configure_logging() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("bergstream").setLevel(logging.INFO)


def echo_lines(lines: list[str]) -> None:
    for line in lines:
        click.echo(line)


def echo_mapping(values: dict[str, Any]) -> None:
    """`key  value` lines, aligned, leaving out what is unset."""
    shown = {key: value for key, value in values.items() if value is not None}
    width = max(len(key) for key in shown)
    for key, value in shown.items():
        click.echo(f"  {key:<{width}}  {value}")


JSON_REPORT = click.option(
    "--json", "as_json", is_flag=True,
    help="Print the report as one JSON document on stdout (a failure too, as ok: false); the exit code "
    "says whether the command did its work.",
)  # fmt: skip


class ReportedFailure(BergstreamError):
    """The command did not do its work and has printed its report: said on stderr, not reported again."""


def reports_json(command: str) -> Callable[[_Command], _Command]:
    """With --json, a command that fails before its report prints `{"command", "ok": false, "error"}`, so
    that whatever reads its output always finds one document; the exit code stays non-zero."""

    def decorate(function: _Command) -> _Command:
        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return function(*args, **kwargs)
            except ReportedFailure:
                raise
            except Exception as error:
                if kwargs.get("as_json"):
                    click.echo(json.dumps({"command": command, "ok": False, "error": str(error)}, indent=2))
                raise

        return run  # type: ignore[return-value]

    return decorate


def echo_report(
    as_json: bool, command: str, report: dict[str, Any], lines: list[str], failure: str | None = None
) -> None:
    """The command's report: one JSON document with `ok`, or its lines; then, when it did not do its work
    (`failure`), a non-zero exit with that message on stderr."""
    if as_json:
        document = {"command": command, "ok": failure is None}
        if failure is not None:
            document["error"] = failure
        click.echo(json.dumps({**document, **report}, indent=2, default=str))
    else:
        echo_lines(lines)
    if failure is not None:
        raise ReportedFailure(failure)
