"""The `bergstream` command line: a group per part of bergstream, each command a few lines that read its
options and call the part below."""

from __future__ import annotations

import faulthandler
import sys

import click

from bergstream.cli import app, backfill, demo, deploy, jars, local, produce, router
from bergstream.errors import BergstreamError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="bergstream", prog_name="bergstream")
def cli() -> None:
    """Archive Kafka topics into Apache Iceberg, and backfill streaming applications from the archive."""


for command in (
    local.local, produce.produce, router.router, backfill.backfill, app.app, deploy.deploy, jars.jars,
    demo.demo,
):  # fmt: skip
    cli.add_command(command)


def main() -> None:
    # A crash inside a native library (librdkafka, the JVM bridge) prints the Python stacks, not nothing.
    faulthandler.enable()
    try:
        cli(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("bergstream: aborted", err=True)
        sys.exit(130)
    except click.ClickException as error:
        error.show()
        sys.exit(error.exit_code)
    except BergstreamError as error:
        click.echo(f"bergstream: error: {error}", err=True)
        sys.exit(1)
