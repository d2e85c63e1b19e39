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
    "--topic", "topics", multiple=True,
    help="The topic whose router to render; repeated, with --group, one driver for them all.",
)  # fmt: skip
PATTERN = click.option(
    "--pattern", default=None, metavar="REGEX",
    help="Render one query for every topic whose whole name matches (`router run --pattern`), topics "
    "created later too: the --defaults and the matching files of --topics-dir travel with it.",
)  # fmt: skip
DEFAULTS = click.option(
    "--defaults", "defaults_file", type=click.Path(path_type=Path), default=None,
    help="With --pattern: the settings of every topic without its own file, and of the query itself "
    "(default: the site's topic_defaults).",
)  # fmt: skip
NAME = click.option(
    "--name", default=None,
    help="With --pattern: the query's name, which names its checkpoint (default: from the pattern).",
)  # fmt: skip


class PatternRender:
    """What a --pattern renders from: the query's settings, its defaults as the router reads them, and
    the matching topics' own files."""

    def __init__(
        self,
        pattern: str,
        name: str | None,
        defaults_file: Path | None,
        topics_dir: Path | None,
        data_dir: Path | None,
        local_stack: bool = True,
    ) -> None:
        from bergstream.cli.endpoints import Endpoints
        from bergstream.router.config import topics_dir as topics_folder
        from bergstream.router.driver.settings import load_pattern_settings, pattern_defaults, pattern_name
        from bergstream.site import site_topic_defaults

        endpoints = Endpoints.resolve(data_dir)
        named = name or pattern_name(pattern)
        self.defaults_file = defaults_file if defaults_file is not None else site_topic_defaults()
        # Elsewhere than this machine, the local stack's addresses mean nothing: only the site's count.
        use = local_stack or endpoints.site is not None
        under = endpoints.router_defaults(named) if use else {}
        self.config = load_pattern_settings(pattern, named, self.defaults_file, under, {})
        self.defaults = pattern_defaults(self.defaults_file, under)
        self.topics_dir = topics_folder(topics_dir)
        regex = self.config.regex
        self.topic_files = {
            path.stem: path.read_text()
            for path in sorted(self.topics_dir.glob("*.yaml"))
            if regex.fullmatch(path.stem)
        }


def _shape(
    topics: tuple[str, ...], pattern: str | None, defaults_file: Path | None, name: str | None
) -> None:
    if bool(topics) == (pattern is not None):
        raise click.UsageError("give --topic (repeatable, with --group) or --pattern")
    if pattern is None and (defaults_file is not None or name is not None):
        raise click.UsageError("--defaults and --name are for --pattern")


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
@PATTERN
@GROUP
@ROUTER_CONFIG
@TOPICS_DIR
@DEFAULTS
@NAME
@click.option("--available-now", is_flag=True, help="Archive what the topic holds, then exit.")
@DATA_DIR
def deploy_spark_submit(
    topics: tuple[str, ...],
    pattern: str | None,
    group: str | None,
    config_file: Path | None,
    topics_dir: Path | None,
    defaults_file: Path | None,
    name: str | None,
    available_now: bool,
    data_dir: Path | None,
) -> None:
    """Print the spark-submit command of a topic's router, with its master and Spark settings; with
    --group, of one driver archiving every --topic."""
    from bergstream.cli.endpoints import Endpoints
    from bergstream.deploy.render import shell_command, spark_submit, spark_submit_group
    from bergstream.router.config import topic_file

    _shape(topics, pattern, defaults_file, name)
    if pattern is not None:
        from bergstream.deploy.render import spark_submit_pattern

        render = PatternRender(pattern, name, defaults_file, topics_dir, data_dir)
        command = spark_submit_pattern(render.config, render.defaults_file, render.topics_dir, available_now)
        click.echo(shell_command(command))
        return
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
@PATTERN
@GROUP
@ROUTER_CONFIG
@TOPICS_DIR
@DEFAULTS
@NAME
def deploy_kubernetes(
    topics: tuple[str, ...],
    pattern: str | None,
    group: str | None,
    config_file: Path | None,
    topics_dir: Path | None,
    defaults_file: Path | None,
    name: str | None,
) -> None:
    """Print the Kubernetes manifests of a topic's router, for `kubectl apply -f -`; with --group, one
    Deployment whose driver archives every --topic in one query; with --pattern, one query for every
    matching topic.

    Nothing comes from the local stack: the topic's file names the cluster's Kafka, catalog and
    checkpoint location."""
    from bergstream.deploy.kubernetes import (
        group_manifests,
        kubernetes_manifests,
        manifests_yaml,
        pattern_manifests,
    )
    from bergstream.router.config import load_router_config, topic_file

    _shape(topics, pattern, defaults_file, name)
    if pattern is not None:
        render = PatternRender(pattern, name, defaults_file, topics_dir, None, local_stack=False)
        manifests = pattern_manifests(render.config, render.defaults, render.topic_files)
        click.echo(manifests_yaml(manifests), nl=False)
        return
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
