"""What an operator deploys for a router, rendered from its settings: the spark-submit command
(`spark_submit`, for a Spark cluster: standalone, YARN, or Kubernetes in client mode, with every setting
bergstream's own session would have) and the settings file it reads; Kubernetes manifests are
kubernetes.py's.

Both are built from a validated RouterConfig: what renders is what `bergstream router run` accepts.

A group of topics renders the same way as one driver running one query of its topics (router/driver):
`spark_submit_group`. The topics of a group share their catalog, their `spark` and their `deploy`
settings, since they share a driver, its executors and its pod.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import TypeVar

import yaml

from bergstream.errors import ConfigError
from bergstream.router.config import QuerySettings, RouterConfig, flat_settings
from bergstream.router.driver.launch import many_topics_conf
from bergstream.router.driver.named import check_shared_driver, driver_app_name, driver_spark_conf
from bergstream.router.driver.settings import DriverSettings
from bergstream.schemas.event_schema import AVRO_DIR
from bergstream.spark import REDACTION_REGEX, session_conf

# The file spark-submit runs: the `bergstream` command in the driver.
SUBMIT_ENTRY = Path(__file__).parent / "submit.py"
# Set by spark-submit itself, or by the cluster manager.
_SUBMIT_FLAGS = {"spark.master", "spark.app.name"}
# A pattern's defaults file, beside the topics' own files in the settings folder.
DEFAULTS_FILE = "defaults.yaml"


# The settings of one driver's query: a topic's router's (`RouterConfig.query`, a group's first topic's), or a
# pattern's query's (`DriverSettings`).
Driver = TypeVar("Driver", bound=QuerySettings)


def app_name(topic: str) -> str:
    return f"bergstream-router-{topic}"


def group_app_name(group: str) -> str:
    return driver_app_name([], group)


def check_group(configs: list[RouterConfig]) -> None:
    """The topics of a group share one driver: its catalog, Spark settings, and how it is deployed."""
    if not configs:
        raise ConfigError("a group needs at least one topic: give --topic")
    first = configs[0]
    topics = [config.settings.topic for config in configs]
    if len(set(topics)) != len(topics):
        raise ConfigError(f"a topic is named twice: {', '.join(topics)}")
    for config, topic in zip(configs[1:], topics[1:], strict=True):
        check_shared_driver(config, first)
        if config.query.deploy != first.query.deploy:
            raise ConfigError(
                f"topic {topic}: its deploy settings differ from those of topic {topics[0]}; "
                "the topics of a group share one driver's pod and executors: make them the same"
            )


def metrics_port(config: QuerySettings) -> int:
    """The router's own metrics_port when it sets one, else the deployment's."""
    return config.metrics_port if config.metrics_port is not None else config.deploy.metrics_port


def spark_submit(config: RouterConfig, config_file: Path | None, available_now: bool = False) -> list[str]:
    """The spark-submit command that runs the router of `config`, whose settings are in `config_file`."""
    arguments = [
        "--topic", config.settings.topic,
        *(["--config", str(config_file.absolute())] if config_file is not None else []),
    ]  # fmt: skip
    return _spark_submit(
        config.query, app_name(config.settings.topic), config.query.spark.conf, arguments, available_now
    )


def spark_submit_group(
    group: str, configs: list[RouterConfig], topics_dir: Path, available_now: bool = False
) -> list[str]:
    """The spark-submit command of one driver archiving every topic of `configs`, read from `topics_dir`."""
    check_group(configs)
    first = configs[0]
    arguments = ["--group", group]
    for config in configs:
        arguments += ["--topic", config.settings.topic]
    arguments += ["--topics-dir", str(topics_dir.absolute())]
    conf = many_topics_conf(driver_spark_conf(first.query.spark.conf))
    return _spark_submit(first.query, group_app_name(group), conf, arguments, available_now)


def spark_submit_pattern(
    config: DriverSettings, defaults_file: Path | None, topics_dir: Path | None, available_now: bool = False
) -> list[str]:
    """The spark-submit command of one query archiving every topic `config.pattern` matches."""
    assert config.pattern is not None, "a query of named topics renders as a group"
    arguments = ["--pattern", config.pattern, "--name", config.name]
    if defaults_file is not None:
        arguments += ["--defaults", str(defaults_file.absolute())]
    if topics_dir is not None:
        arguments += ["--topics-dir", str(topics_dir.absolute())]
    conf = many_topics_conf(config.spark.conf)
    return _spark_submit(config, pattern_app_name(config.name), conf, arguments, available_now)


def pattern_app_name(name: str) -> str:
    return f"bergstream-router-{name}"


def _spark_submit(
    config: QuerySettings,
    name: str,
    spark_conf: dict[str, str],
    arguments: list[str],
    available_now: bool,
) -> list[str]:
    conf = session_conf(config.catalog, config.spark.master, name, spark_conf)
    command = [
        "spark-submit",
        "--master", config.spark.master,
        "--deploy-mode", "client",
        "--name", name,
    ]  # fmt: skip
    # The driver runs bergstream's own code: the interpreter that has it installed.
    conf.setdefault("spark.pyspark.driver.python", sys.executable)
    for key, value in conf.items():
        # Secrets stay off the command line: the driver's own session takes them from the settings file.
        if key not in _SUBMIT_FLAGS and not re.search(REDACTION_REGEX, key):
            command += ["--conf", f"{key}={value}"]
    command += [str(SUBMIT_ENTRY), "router", "run", *arguments, "--metrics-port", str(metrics_port(config))]
    if available_now:
        command.append("--available-now")
    return command


def shell_command(command: list[str]) -> str:
    """A command as a shell line, one option per line."""
    lines, current = [], [shlex.quote(command[0])]
    for part in command[1:]:
        if part.startswith("--"):
            lines.append(" ".join(current))
            current = []
        current.append(shlex.quote(part))
    lines.append(" ".join(current))
    return " \\\n  ".join(lines)


def settings_file(config: RouterConfig) -> str:
    """A router's settings as the YAML file `bergstream router run --config` reads: flat, as written."""
    dumped = flat_settings(config, mode="json", exclude_none=True)
    # What the file is of first, then the query's settings, then the topic's own.
    data = {key: dumped[key] for key in ("topic", "schema") if key in dumped} | dumped
    if config.settings.schema_dir == AVRO_DIR:  # the schemas inside the image, wherever it installed them
        del data["schema_dir"]
    if config.query.catalog.password is not None:
        data["catalog"]["password"] = config.query.catalog.password.get_secret_value()
    registry = config.settings.schema_registry
    if registry is not None and registry.basic_auth_user_info is not None:
        data["schema_registry"]["basic.auth.user.info"] = registry.basic_auth_user_info.get_secret_value()
    return yaml.safe_dump(data, sort_keys=False)
