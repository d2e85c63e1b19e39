"""`bergstream deploy`: what runs a topic's router elsewhere: spark-submit commands, Kubernetes manifests."""

from __future__ import annotations

from pathlib import Path

import click

from bergstream.cli.options import DATA_DIR, ROUTER_CONFIG, TOPICS_DIR
from bergstream.cli.router import topic_loader


@click.group()
def deploy() -> None:
    """Render what runs a topic's router elsewhere: a spark-submit command, Kubernetes manifests."""


TOPICS = click.option(
    "--topic", "topics", multiple=True, required=True,
    help="The topic whose router to render; repeated, with --group, one driver for them all.",
)  # fmt: skip
GROUP = click.option(
    "--group", default=None,
    help="Render one driver running a query per --topic, named after this group (the topics' files "
    "from --topics-dir), instead of a driver per topic.",
)  # fmt: skip


def _group_dir(
    topics: tuple[str, ...], group: str | None, config_file: Path | None, topics_dir: Path | None
) -> Path | None:
    """The folder of a group's settings files; None for one topic's own driver."""
    from bergstream.router.config import topics_dir as topics_folder

    if group is None:
        if len(topics) > 1:
            raise click.UsageError("several topics run in one driver: name it with --group")
        if topics_dir is not None:
            raise click.UsageError("--topics-dir is for a --group; one topic's file is given with --config")
        return None
    if config_file is not None:
        raise click.UsageError("--config is one topic's file; a group's files are read from --topics-dir")
    return topics_folder(topics_dir)


@deploy.command("spark-submit")
@TOPICS
@GROUP
@ROUTER_CONFIG
@TOPICS_DIR
@click.option("--available-now", is_flag=True, help="Archive what the topic holds, then exit.")
@DATA_DIR
def deploy_spark_submit(
    topics: tuple[str, ...],
    group: str | None,
    config_file: Path | None,
    topics_dir: Path | None,
    available_now: bool,
    data_dir: Path | None,
) -> None:
    """Print the spark-submit command of a topic's router, with its master and Spark settings; with
    --group, of one driver archiving every --topic."""
    from bergstream.cli.endpoints import Endpoints
    from bergstream.deploy.render import shell_command, spark_submit, spark_submit_group
    from bergstream.router.config import topic_file

    directory = _group_dir(topics, group, config_file, topics_dir)
    load = topic_loader(Endpoints.resolve(data_dir), config_file, directory, overrides={})
    if group is not None and directory is not None:
        configs = [load(topic) for topic in topics]
        click.echo(shell_command(spark_submit_group(group, configs, directory, available_now)))
        return
    (topic,) = topics
    path = config_file if config_file is not None else topic_file(topic)
    click.echo(shell_command(spark_submit(load(topic), path, available_now)))


@deploy.command("kubernetes")
@TOPICS
@GROUP
@ROUTER_CONFIG
@TOPICS_DIR
def deploy_kubernetes(
    topics: tuple[str, ...], group: str | None, config_file: Path | None, topics_dir: Path | None
) -> None:
    """Print the Kubernetes manifests of a topic's router, for `kubectl apply -f -`; with --group, one
    Deployment whose driver archives every --topic, a query each.

    Nothing comes from the local stack: the topic's file names the cluster's Kafka, catalog and
    checkpoint location."""
    from bergstream.deploy.render import group_manifests, kubernetes_manifests, manifests_yaml
    from bergstream.router.config import load_router_config, topic_file

    directory = _group_dir(topics, group, config_file, topics_dir)
    configs = [
        load_router_config(
            topic, config_file if config_file is not None else topic_file(topic, directory), {}, {}
        )
        for topic in topics
    ]
    if group is not None:
        click.echo(manifests_yaml(group_manifests(group, configs)), nl=False)
    else:
        click.echo(manifests_yaml(kubernetes_manifests(configs[0])), nl=False)
