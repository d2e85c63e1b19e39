"""`bergstream jars`: the pinned JVM jars, resolved into the local cache."""

from __future__ import annotations

from dataclasses import asdict

import click

from bergstream.cli.options import echo_mapping


@click.group()
def jars() -> None:
    """The JVM jars pinned in core/src/bergstream/jvm/pom.xml."""


@jars.command("resolve")
@click.argument(
    "jar_sets",
    nargs=-1,
    type=click.Choice(["spark", "kafka", "rest-catalog", "kafka-connect", "iceberg-kafka-connect"]),
)
def jars_resolve(jar_sets: tuple[str, ...]) -> None:
    """Resolve the pinned jars into the local cache (once; later calls do nothing): those the local stack
    runs, or the sets named."""
    from bergstream import jars as pinned

    named = tuple(s for s in (*pinned.JAR_SETS, *pinned.ON_DEMAND_JAR_SETS) if s in jar_sets)
    chosen = named or pinned.JAR_SETS
    for jar_set, directory in pinned.resolve_all(jar_sets=chosen).items():
        click.echo(f"{jar_set}: {len(pinned.resolved_jars(jar_set))} jars in {directory}")
    click.echo(f"bergstream's Java: {pinned.project_jar()}")


@jars.command("versions")
def jars_versions() -> None:
    """Print the pinned Spark, Iceberg and Kafka versions."""
    from bergstream import jars as pinned

    echo_mapping(asdict(pinned.pinned_versions()))
