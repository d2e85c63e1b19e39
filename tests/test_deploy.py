"""What `bergstream deploy` renders runs: the spark-submit command archives a topic, the Kubernetes
manifests hang together and carry settings the router accepts."""

from __future__ import annotations

import itertools
import os
import re
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from click.testing import CliRunner

from bergstream.catalog import CatalogConfig
from bergstream.cli import cli
from bergstream.deploy.kubernetes import DRIVER_PORT, group_manifests, kubernetes_manifests, manifests_yaml
from bergstream.deploy.render import spark_submit, spark_submit_group
from bergstream.errors import ConfigError
from bergstream.loadgen.producer import ProduceRequest, produce
from bergstream.local.processes import free_ports
from bergstream.router.config import RouterConfig, load_router_config
from bergstream.router.driver.launch import MANY_TOPICS_JAVA_OPTIONS, many_topics_conf
from bergstream.spark import REDACTION_REGEX
from tests.routers import ROOT, archived_offsets, write_config
from tests.services import Services


def pyspark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def production_config(**deploy: Any) -> RouterConfig:
    return RouterConfig.flat(
        {
            "topic": "Playback.EU",
            "schema": "playback",
            "encoding": "json",
            "table": "playback_eu",
            "cluster": "eu-west-1",
            "kafka": {"kafka.bootstrap.servers": "kafka-0.kafka:9092,kafka-1.kafka:9092"},
            "checkpoint_location": "s3a://archive/checkpoints/playback_eu",
            "catalog": CatalogConfig(
                uri="jdbc:postgresql://catalog:5432/iceberg",
                warehouse="s3a://archive/w",
                user="u",
                password="pw",
            ),
            "spark": {"conf": {"spark.executor.memoryOverhead": "1g"}},
            "deploy": {"image": "registry.example/bergstream:1.0", "namespace": "archive", **deploy},
        }
    )


def by_kind(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    kinds = Counter(m["kind"] for m in manifests)
    assert all(count == 1 for count in kinds.values()), kinds
    return {m["kind"]: m for m in manifests}


def test_kubernetes_manifests_hang_together(tmp_path: Path) -> None:
    config = production_config(executor_instances=6, driver_memory="4g")
    objects = by_kind(list(yaml.safe_load_all(manifests_yaml(kubernetes_manifests(config)))))
    assert set(objects) == {
        "ServiceAccount", "Role", "RoleBinding", "Secret", "Service", "Deployment", "ServiceMonitor"
    }  # fmt: skip
    name = "bergstream-router-playback-eu"
    assert {m["metadata"]["name"] for m in objects.values()} == {name}
    assert {m["metadata"]["namespace"] for m in objects.values()} == {"archive"}

    deployment = objects["Deployment"]["spec"]
    assert deployment["replicas"] == 1 and deployment["strategy"] == {"type": "Recreate"}
    pod = deployment["template"]["spec"]
    assert deployment["selector"]["matchLabels"] == deployment["template"]["metadata"]["labels"]
    assert objects["Service"]["spec"]["selector"] == deployment["selector"]["matchLabels"]
    assert objects["Service"]["spec"]["clusterIP"] == "None"
    assert pod["serviceAccountName"] == objects["RoleBinding"]["subjects"][0]["name"] == name
    assert objects["RoleBinding"]["roleRef"]["name"] == objects["Role"]["metadata"]["name"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.example/bergstream:1.0"
    assert container["resources"]["requests"]["memory"] == f"{4096 + 409}Mi"
    container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert {p["name"]: p["targetPort"] for p in objects["Service"]["spec"]["ports"]} == container_ports
    # Prometheus Operator scrapes the router's metrics and Spark's, through the Service's named ports.
    monitor = objects["ServiceMonitor"]["spec"]
    assert monitor["selector"]["matchLabels"] == objects["Service"]["metadata"]["labels"]
    assert monitor["namespaceSelector"] == {"matchNames": ["archive"]}
    assert {(e["port"], e["path"]) for e in monitor["endpoints"]} == {
        ("metrics", "/metrics"),
        ("spark-ui", "/metrics/prometheus"),
        ("spark-ui", "/metrics/executors/prometheus"),
    }
    assert container_ports["spark-ui"] == 4040
    annotations = objects["Service"]["metadata"]["annotations"]
    metrics_port = next(p["containerPort"] for p in container["ports"] if p["name"] == "metrics")
    assert annotations["prometheus.io/port"] == str(metrics_port)

    # The settings in the Secret are what the router reads, at the path the container is given.
    ((file_name, settings),) = objects["Secret"]["stringData"].items()
    mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "settings")
    assert container["args"][container["args"].index("--config") + 1] == f"{mount}/{file_name}"
    assert pod["volumes"][0]["secret"]["secretName"] == objects["Secret"]["metadata"]["name"]
    (tmp_path / file_name).write_text(settings)
    inside = load_router_config("Playback.EU", tmp_path / file_name, defaults={}, overrides={})
    assert inside.query.spark.master == "k8s://https://kubernetes.default.svc"
    conf = inside.query.spark.conf
    assert conf["spark.driver.host"] == f"{name}.archive.svc"
    assert conf["spark.driver.port"] == str(DRIVER_PORT)
    assert conf["spark.executor.instances"] == "6"
    assert conf["spark.executor.memoryOverhead"] == "1g"  # the topic's own Spark settings survive
    assert "schema_dir" not in yaml.safe_load(settings)  # the image's own schemas, not this machine's path
    assert (
        inside.query.catalog.password is not None and inside.query.catalog.password.get_secret_value() == "pw"
    )
    assert (inside.query.kafka, inside.query.catalog, inside.query.checkpoint_location) == (
        config.query.kafka,
        config.query.catalog,
        config.query.checkpoint_location,
    )
    assert inside.query.metrics_port == metrics_port


def test_bad_deploy_settings_are_refused_with_the_key(tmp_path: Path) -> None:
    path = tmp_path / "playback.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "topic": "playback",
                "encoding": "json",
                "kafka": {"kafka.bootstrap.servers": "k:9092"},
                "checkpoint_location": "/c",
                "catalog": {"uri": "jdbc:sqlite:/tmp/c.db", "warehouse": "file:///tmp/w"},
                "deploy": {"executor_memory": "lots"},
            }
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "bergstream", "deploy", "kubernetes", "--topic", "playback",
         "--config", str(path)],
        capture_output=True, text=True, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 1
    assert "deploy.executor_memory" in done.stderr and str(path) in done.stderr


@pytest.mark.integration
def test_the_rendered_spark_submit_command_archives_the_topic(
    stack: Services, topic_name: str, tmp_path: Path
) -> None:
    report = produce(
        ProduceRequest(topic=topic_name, schema="playback", count=3000, bad_fraction=0.01, seed=4),
        stack.bootstrap_servers,
        show_progress=False,
    )
    (metrics_port,) = free_ports(1)
    config_file = write_config(
        stack, tmp_path, topic_name, metrics_port=metrics_port, metrics_host="127.0.0.1"
    )
    rendered = subprocess.run(
        [sys.executable, "-m", "bergstream", "deploy", "spark-submit", "--topic", topic_name,
         "--config", str(config_file), "--available-now"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout  # fmt: skip
    arguments = shlex.split(rendered.replace("\\\n", " "))
    config = load_router_config(topic_name, config_file, defaults={}, overrides={})
    assert arguments[0] == "spark-submit"
    assert arguments[arguments.index("--master") + 1] == config.query.spark.master
    assert arguments[arguments.index("--metrics-port") + 1] == str(metrics_port)

    spark_home_bin = str(Path(sys.executable).parent)
    done = subprocess.run(
        ["bash", "-c", rendered],
        capture_output=True, text=True, check=False, timeout=600, cwd=tmp_path,
        env={**os.environ, "PATH": f"{spark_home_bin}:{os.environ['PATH']}"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    bad = sum(report.malformed.values())
    assert f"archived {3000 - bad:,}, dead-lettered {bad:,}" in done.stdout
    produced = {(p, o) for p, (low, high) in report.offsets.items() for o in range(low, high + 1)}
    assert sorted(archived_offsets(stack, topic_name)) == sorted(produced)


def test_spark_submit_carries_every_session_setting(tmp_path: Path) -> None:
    config = production_config()
    command = spark_submit(config, tmp_path / "playback.yaml")
    confs = dict(command[i + 1].split("=", 1) for i, part in enumerate(command) if part == "--conf")
    assert confs["spark.sql.extensions"].endswith("IcebergSparkSessionExtensions")
    assert confs["spark.sql.defaultCatalog"] == config.query.catalog.name
    assert confs["spark.executor.memoryOverhead"] == "1g"
    assert confs["spark.pyspark.driver.python"] == sys.executable
    assert "spark.master" not in confs
    # The catalog's password stays off the command line: the driver reads it from the settings file.
    assert f"spark.sql.catalog.{config.query.catalog.name}.jdbc.password" not in confs
    assert not any(part.endswith("=pw") for part in command)
    entry = command.index("router") - 1
    assert Path(command[entry]).is_file()
    assert command[entry + 1 :] == [
        "router", "run", "--topic", "Playback.EU", "--config", str((tmp_path / "playback.yaml").absolute()),
        "--metrics-port", "9464",
    ]  # fmt: skip


def group_configs(**deploy: Any) -> list[RouterConfig]:
    first = production_config(**deploy)
    second = RouterConfig(
        settings=first.settings.model_copy(update={"topic": "Impression.EU", "table": "impression_eu"}),
        query=first.query.model_copy(update={"checkpoint_location": "s3a://archive/c/i"}),
    )
    return [first, second]


def test_a_group_of_topics_renders_one_deployment_whose_driver_runs_them_all(tmp_path: Path) -> None:
    configs = group_configs(executor_instances=4)
    objects = by_kind(list(yaml.safe_load_all(manifests_yaml(group_manifests("eu", configs)))))
    name = "bergstream-routers-eu"
    assert {m["metadata"]["name"] for m in objects.values()} == {name}
    deployment = objects["Deployment"]["spec"]
    assert deployment["replicas"] == 1 and deployment["strategy"] == {"type": "Recreate"}
    (container,) = deployment["template"]["spec"]["containers"]
    arguments = container["args"]
    assert arguments[:3] == ["bergstream", "router", "run"]
    assert arguments[arguments.index("--group") + 1] == "eu"
    assert [arguments[i + 1] for i, a in enumerate(arguments) if a == "--topic"] == [
        "Playback.EU",
        "Impression.EU",
    ]
    mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "settings")
    assert arguments[arguments.index("--topics-dir") + 1] == mount

    # Each topic's settings, as its router reads them from the mounted folder, inside the group's pod.
    files = objects["Secret"]["stringData"]
    assert set(files) == {"Playback.EU.yaml", "Impression.EU.yaml"}
    for config in configs:
        (tmp_path / f"{config.settings.topic}.yaml").write_text(files[f"{config.settings.topic}.yaml"])
        inside = load_router_config(
            config.settings.topic, tmp_path / f"{config.settings.topic}.yaml", defaults={}, overrides={}
        )
        assert inside.query.spark.conf["spark.driver.host"] == f"{name}.archive.svc"
        assert inside.query.spark.conf["spark.kubernetes.executor.podNamePrefix"] == name
        assert inside.query.spark.conf["spark.executor.instances"] == "4"
        assert (inside.settings.table, inside.query.checkpoint_location) == (
            config.settings.table,
            config.query.checkpoint_location,
        )

    # One topic per driver stays as it was, under its own name: both shapes can run side by side.
    (single,) = [m for m in kubernetes_manifests(configs[0]) if m["kind"] == "Deployment"]
    assert single["metadata"]["name"] == "bergstream-router-playback-eu"


def test_a_group_s_spark_submit_runs_every_topic_in_one_fair_driver(tmp_path: Path) -> None:
    command = spark_submit_group("eu", group_configs(), tmp_path)
    confs = dict(command[i + 1].split("=", 1) for i, part in enumerate(command) if part == "--conf")
    assert confs["spark.scheduler.mode"] == "FAIR"
    # A driver of many topics gives back the heap it does not use; bergstream's own options stay.
    options = confs["spark.driver.extraJavaOptions"]
    assert MANY_TOPICS_JAVA_OPTIONS in options and "org.apache.avro.limits.string.maxLength" in options
    assert command[command.index("--name") + 1] == "bergstream-routers-eu"
    entry = command.index("router") - 1
    assert command[entry + 1 :] == [
        "router", "run", "--group", "eu", "--topic", "Playback.EU", "--topic", "Impression.EU",
        "--topics-dir", str(tmp_path.absolute()), "--metrics-port", "9464",
    ]  # fmt: skip


def test_java_options_of_the_topics_settings_come_after_a_many_topic_driver_s_own() -> None:
    conf = many_topics_conf({"spark.driver.extraJavaOptions": "-XX:MaxHeapFreeRatio=70", "spark.x": "y"})
    assert conf["spark.driver.extraJavaOptions"] == f"{MANY_TOPICS_JAVA_OPTIONS} -XX:MaxHeapFreeRatio=70"
    assert conf["spark.x"] == "y" and conf["spark.kafka.consumer.cache.capacity"] == "4096"
    assert many_topics_conf({})["spark.driver.extraJavaOptions"] == MANY_TOPICS_JAVA_OPTIONS


def test_a_group_refuses_topics_that_cannot_share_a_driver() -> None:
    first, second = group_configs()
    deploy = second.query.deploy.model_copy(update={"executor_instances": 9})
    other = second.model_copy(update={"query": second.query.model_copy(update={"deploy": deploy})})
    with pytest.raises(
        ConfigError, match=r"topic Impression\.EU: its deploy settings differ from those of topic"
    ):
        group_manifests("eu", [first, other])
    with pytest.raises(ConfigError, match="a topic is named twice"):
        spark_submit_group("eu", [first, first], Path("."))


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--topic", "a", "--topic", "b"], "several topics run in one driver: name it with --group"),
        (["--topic", "a", "--group", "g", "--config", "a.yaml"], "--config is one topic's file"),
        (["--topic", "a", "--topics-dir", "."], "--topics-dir is for a --group"),
    ],
)
def test_deploy_refuses_an_ambiguous_shape_naming_the_flag(arguments: list[str], message: str) -> None:
    done = CliRunner().invoke(cli, ["deploy", "kubernetes", *arguments])
    assert done.exit_code == 2
    assert message in done.output


POD_DRIVER = """
import os, sys, time
from pyspark.sql import SparkSession

os.environ["PYSPARK_PYTHON"] = sys.executable
spark = (SparkSession.builder.master(sys.argv[1]).appName("bergstream-pod-test")
         .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
         .config("spark.cores.max", "1").getOrCreate())
context = spark.sparkContext
print("ready", context.applicationId, context.getConf().get("spark.driver.port"), flush=True)
scala = context._jsc.sc()
deadline = time.monotonic() + 120
while "7" not in [str(scala.getExecutorIds().apply(i)) for i in range(scala.getExecutorIds().size())]:
    if time.monotonic() > deadline:
        sys.exit("executor 7 never registered")
    time.sleep(0.2)
print("sum", context.parallelize(range(100), 4).map(lambda x: x * 2).sum(), flush=True)
spark.stop()
"""


@pytest.mark.integration
def test_the_image_entrypoint_starts_an_executor_as_spark_on_kubernetes_asks(tmp_path: Path) -> None:
    """`executor`, with the environment Spark's executor pods get, joins the driver and runs its Python
    tasks: here a driver of a standalone master with no worker, so every task runs on that executor."""
    from tests.spark_cluster import spark_cluster

    with spark_cluster(tmp_path / "spark", workers=0) as cluster:
        driver = subprocess.Popen(
            [sys.executable, "-c", POD_DRIVER, cluster.master_url], stdout=subprocess.PIPE, text=True,
            env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
        )  # fmt: skip
        assert driver.stdout is not None
        executor = None
        try:
            _, application, port = driver.stdout.readline().split()
            environment = {
                **os.environ, "SPARK_DRIVER_URL": f"spark://CoarseGrainedScheduler@127.0.0.1:{port}",
                "SPARK_EXECUTOR_ID": "7", "SPARK_EXECUTOR_CORES": "1", "SPARK_APPLICATION_ID": application,
                "SPARK_EXECUTOR_POD_IP": "127.0.0.1", "SPARK_EXECUTOR_MEMORY": "512m",
                "SPARK_JAVA_OPT_0": "-Dbergstream.pod.test=yes",
            }  # fmt: skip
            log = tmp_path / "executor.log"
            with log.open("w") as output:
                command = [sys.executable, "-m", "bergstream.deploy.pod", "executor"]
                executor = subprocess.Popen(command, env=environment, stdout=output, stderr=subprocess.STDOUT)
            # The executor's JVM in place of the entrypoint's process, with the driver's Java options.
            summed = driver.stdout.readline().strip()
            assert summed == "sum 9900", log.read_text()[-3000:]
            java = psutil.Process(executor.pid).cmdline()
            assert "-Dbergstream.pod.test=yes" in java and "-Xmx512m" in java, java
            assert driver.wait(120) == 0
        finally:
            driver.kill()
            if executor is not None:
                executor.kill()
                executor.wait()


def test_a_pod_started_without_sparks_environment_says_what_is_missing() -> None:
    done = subprocess.run([sys.executable, "-m", "bergstream.deploy.pod", "executor"], capture_output=True,
                          text=True, env={"PATH": os.environ["PATH"]}, timeout=60)  # fmt: skip
    assert done.returncode != 0
    assert "executor pod: SPARK_EXECUTOR_MEMORY is not set" in done.stderr, done.stderr


def test_a_spark_application_runs_the_router_through_the_spark_operator(tmp_path: Path) -> None:
    """The Spark Operator's SparkApplication: the image's submit file runs `router run` with the topic's
    settings from the Secret it mounts, the driver pod carries the labels the Service and PodMonitor select,
    and no secret is among the Spark settings the operator shows."""
    config = production_config(workload="SparkApplication", monitor="PodMonitor", executor_instances=3)
    objects = by_kind(list(yaml.safe_load_all(manifests_yaml(kubernetes_manifests(config)))))
    assert set(objects) == {
        "ServiceAccount", "Role", "RoleBinding", "Secret", "Service", "SparkApplication", "PodMonitor"
    }  # fmt: skip
    application = objects["SparkApplication"]
    assert application["apiVersion"] == "sparkoperator.k8s.io/v1beta2"
    spec = application["spec"]
    assert (spec["type"], spec["mode"], spec["image"]) == (
        "Python",
        "cluster",
        "registry.example/bergstream:1.0",
    )
    assert spec["mainApplicationFile"] == "local:///opt/bergstream/submit.py"
    assert spec["sparkVersion"] == pyspark_version()
    assert spec["restartPolicy"]["type"] == "Always"
    driver, executor = spec["driver"], spec["executor"]
    name = application["metadata"]["name"]
    assert driver["serviceAccount"] == objects["RoleBinding"]["subjects"][0]["name"] == name
    assert (
        driver["labels"]
        == objects["Service"]["spec"]["selector"]
        == objects["PodMonitor"]["spec"]["selector"]["matchLabels"]
    )
    assert (executor["instances"], executor["cores"], executor["memory"]) == (3, 2, "4g")
    assert driver["memory"] == "2g"
    assert not any(re.search(REDACTION_REGEX, key) for key in spec["sparkConf"])
    assert "pw" not in yaml.safe_dump(spec)
    # Prometheus finds the router's metrics port on the driver pod, Spark's UI under Spark's own name.
    assert [p["name"] for p in driver["ports"]] == ["metrics"]
    assert {e["port"] for e in objects["PodMonitor"]["spec"]["podMetricsEndpoints"]} == {
        "metrics",
        "spark-ui",
    }

    # The arguments run the topic's router with the settings file the Secret puts where they say.
    arguments = spec["arguments"]
    assert arguments[:2] == ["router", "run"]
    ((secret,),) = [driver["secrets"]]
    assert secret["name"] == objects["Secret"]["metadata"]["name"] and secret["secretType"] == "Generic"
    ((file_name, settings),) = objects["Secret"]["stringData"].items()
    assert arguments[arguments.index("--config") + 1] == f"{secret['path']}/{file_name}"
    (tmp_path / file_name).write_text(settings)
    inside = load_router_config("Playback.EU", tmp_path / file_name, defaults={}, overrides={})
    # The submission gives the driver pod its address: the Deployment's settings for it are not carried.
    assert (
        "spark.driver.host" not in inside.query.spark.conf
        and "spark.driver.port" not in inside.query.spark.conf
    )
    assert inside.query.spark.conf["spark.kubernetes.container.image"] == spec["image"]
    assert (
        inside.query.catalog.password is not None and inside.query.catalog.password.get_secret_value() == "pw"
    )


def test_without_the_prometheus_operator_the_service_annotations_alone_remain() -> None:
    objects = by_kind(kubernetes_manifests(production_config(monitor="none")))
    assert "ServiceMonitor" not in objects and "PodMonitor" not in objects
    assert objects["Service"]["metadata"]["annotations"]["prometheus.io/scrape"] == "true"


def test_a_driver_pod_runs_spark_submit_in_client_mode_with_the_images_jars() -> None:
    from bergstream import jars
    from bergstream.deploy.pod import driver_command

    given = ["--properties-file", "/opt/spark/conf/spark.properties", "local:///opt/bergstream/submit.py",
             "router", "run", "--topic", "playback"]  # fmt: skip
    command = driver_command({"SPARK_DRIVER_BIND_ADDRESS": "10.0.0.7"}, given, "/venv/bin/spark-submit")
    assert command[:3] == ["/venv/bin/spark-submit", "--deploy-mode", "client"]
    assert command[-len(given) :] == given
    settings = dict(value.split("=", 1) for flag, value in itertools.pairwise(command) if flag == "--conf")
    assert settings["spark.driver.bindAddress"] == "10.0.0.7"
    assert settings["spark.jars"] == jars.spark_jar_conf()["spark.jars"]
    # The Avro decoders' limits, which a JVM takes only at its start.
    assert "org.apache.avro.limits.string.maxLength" in settings["spark.driver.extraJavaOptions"]


def test_any_other_command_runs_as_given() -> None:
    done = subprocess.run([sys.executable, "-m", "bergstream.deploy.pod", "echo", "archived"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "archived\n")


def pattern_files(tmp_path: Path) -> tuple[Path, Path]:
    """A pattern's defaults file and a topics folder with one matching topic's file and one that does not."""
    defaults = tmp_path / "defaults.yaml"
    defaults.write_text(yaml.safe_dump({
        "schema": "playback", "encoding": "json", "cluster": "eu-west-1",
        "kafka": {"kafka.bootstrap.servers": "kafka-0.kafka:9092"},
        "checkpoint_location": "s3a://archive/checkpoints/orders",
        "catalog": {"uri": "jdbc:postgresql://catalog:5432/iceberg", "warehouse": "s3a://archive/w",
                    "user": "u", "password": "pw"},
        "deploy": {"image": "registry.example/bergstream:1.0", "namespace": "archive",
                   "executor_instances": 5},
    }))  # fmt: skip
    topics = tmp_path / "topics"
    topics.mkdir()
    (topics / "orders.eu.yaml").write_text(yaml.safe_dump({"schema": "impression", "encoding": "json"}))
    (topics / "clicks.yaml").write_text(yaml.safe_dump({"schema": "playback", "encoding": "json"}))
    return defaults, topics


def test_a_pattern_renders_one_query_whose_pod_holds_the_defaults_and_the_matching_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bergstream.router.driver.settings import load_pattern_settings, pattern_topic_settings

    monkeypatch.delenv("BERGSTREAM_SITE", raising=False)
    defaults, topics = pattern_files(tmp_path)
    done = CliRunner().invoke(cli, ["deploy", "kubernetes", "--pattern", r"orders\..*", "--name", "orders",
                                    "--defaults", str(defaults), "--topics-dir", str(topics)])  # fmt: skip
    assert done.exit_code == 0, done.output
    objects = by_kind(list(yaml.safe_load_all(done.output)))
    name = "bergstream-router-orders"
    assert objects["Deployment"]["metadata"]["name"] == name
    files = objects["Secret"]["stringData"]
    assert set(files) == {"defaults.yaml", "orders.eu.yaml"}, "the defaults and the matching topics' files"
    (container,) = objects["Deployment"]["spec"]["template"]["spec"]["containers"]
    arguments = container["args"]
    assert arguments[:5] == ["bergstream", "router", "run", "--pattern", r"orders\..*"]
    mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "settings")
    assert arguments[arguments.index("--defaults") + 1] == f"{mount}/defaults.yaml"
    assert arguments[arguments.index("--topics-dir") + 1] == mount

    # As the router reads them in the pod: the query's settings, and a topic's own file over the defaults.
    inside = tmp_path / "inside"
    inside.mkdir()
    for file_name, text in files.items():
        (inside / file_name).write_text(text)
    config = load_pattern_settings(r"orders\..*", "orders", inside / "defaults.yaml", {}, {})
    assert config.spark.master == "k8s://https://kubernetes.default.svc"
    assert config.spark.conf["spark.driver.host"] == f"{name}.archive.svc"
    assert config.spark.conf["spark.executor.instances"] == "5"
    assert config.checkpoint_location == "s3a://archive/checkpoints/orders"
    assert config.catalog.password is not None and config.catalog.password.get_secret_value() == "pw"
    load = pattern_topic_settings(config, inside / "defaults.yaml", inside, lambda topic: {}, {})
    assert load("orders.eu").settings.schema_name == "impression"
    assert load("orders.us").settings.schema_name == "playback"  # no file of its own: the defaults


def test_a_patterns_spark_submit_runs_the_query_with_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BERGSTREAM_SITE", raising=False)
    defaults, topics = pattern_files(tmp_path)
    done = CliRunner().invoke(cli, ["deploy", "spark-submit", "--pattern", r"orders\..*", "--name", "orders",
                                    "--defaults", str(defaults), "--topics-dir", str(topics)])  # fmt: skip
    assert done.exit_code == 0, done.output
    command = [word for word in shlex.split(done.output) if word.strip()]
    run = command[command.index("run") :]
    assert run[:5] == ["run", "--pattern", r"orders\..*", "--name", "orders"]
    assert run[run.index("--defaults") + 1] == str(defaults.absolute())
    assert "spark.kafka.consumer.cache.capacity=4096" in command
    assert "pw" not in done.output


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ([], "give --topic (repeatable, with --group) or --pattern"),
        (["--topic", "a", "--pattern", "a.*"], "give --topic (repeatable, with --group) or --pattern"),
        (["--topic", "a", "--defaults", "d.yaml"], "--defaults and --name are for --pattern"),
    ],
)
def test_deploy_asks_for_topics_or_a_pattern(arguments: list[str], message: str) -> None:
    for command in ("kubernetes", "spark-submit"):
        done = CliRunner().invoke(cli, ["deploy", command, *arguments])
        assert done.exit_code == 2 and message in done.output, done.output
