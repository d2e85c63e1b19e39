"""The router on Kubernetes, rendered from its settings (render.py renders its spark-submit command).

- `kubernetes_manifests`: the router as a one-replica Deployment. The driver runs in that pod, Spark
  starts the executors as pods beside it; the topic's settings travel in a Secret; a headless Service gives
  executors a name to reach the driver by and Prometheus its metrics port.
- `group_manifests`, `pattern_manifests`: one driver running the query of a group's topics, or of a
  pattern's, the same way (or as a SparkApplication of the Spark operator, `deploy.workload`).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from bergstream.deploy.render import (
    DEFAULTS_FILE,
    Driver,
    check_group,
    group_app_name,
    metrics_port,
    pattern_app_name,
    settings_file,
)
from bergstream.errors import ConfigError
from bergstream.router.config import QuerySettings, RouterConfig
from bergstream.router.driver.settings import DriverSettings
from bergstream.spark import REDACTION_REGEX

CONFIG_MOUNT = "/etc/bergstream"
DRIVER_PORT, BLOCK_MANAGER_PORT = 7078, 7079
# A router stops after its current batch on SIGTERM: give a large batch time to commit.
GRACE_SECONDS = 300
SPARK_UI_PORT = 4040
# Where the image (Dockerfile) keeps the file spark-submit runs: a SparkApplication's mainApplicationFile.
IMAGE_SUBMIT_FILE = "/opt/bergstream/submit.py"
# Settings a SparkApplication carries in fields of its own, or that the image's entrypoint sets.
_SPARK_APPLICATION_FIELDS = {
    "spark.driver.memory", "spark.executor.instances", "spark.executor.cores", "spark.executor.memory",
    "spark.kubernetes.namespace", "spark.kubernetes.container.image",
}  # fmt: skip


def object_name(topic: str) -> str:
    """A Kubernetes object name for the topic's router: lower case, at most 63 characters."""
    cleaned = "".join(c if c.isalnum() else "-" for c in topic.lower()).strip("-")
    return f"bergstream-router-{cleaned}"[:63].rstrip("-")


def group_object_name(group: str) -> str:
    """The Kubernetes object name of a group's driver; `bergstream-routers-` keeps it apart from topics'."""
    cleaned = "".join(c if c.isalnum() else "-" for c in group.lower()).strip("-")
    if not cleaned:
        raise ConfigError(f"--group {group!r}: name the group with letters or digits")
    return group_app_name(cleaned)[:63].rstrip("-")


def kubernetes_config(config: Driver, name: str) -> Driver:
    """The settings of the driver inside Kubernetes, in the pod `name`: Spark's master is the cluster's API
    server."""
    deploy = config.deploy
    master = (
        config.spark.master if config.spark.master.startswith("k8s://") else f"k8s://{deploy.kubernetes_api}"
    )
    # The driver pod of a Deployment is reached through the headless Service; a SparkApplication's
    # submission gives its driver pod a service and these settings of its own.
    reached = {
        "spark.driver.host": f"{name}.{deploy.namespace}.svc",
        "spark.driver.bindAddress": "0.0.0.0",
        "spark.driver.port": str(DRIVER_PORT),
        "spark.blockManager.port": str(BLOCK_MANAGER_PORT),
    }
    conf = {
        "spark.kubernetes.namespace": deploy.namespace,
        "spark.kubernetes.container.image": deploy.image,
        "spark.kubernetes.executor.podNamePrefix": name,
        **(reached if deploy.workload == "Deployment" else {}),
        "spark.driver.memory": deploy.driver_memory,
        "spark.executor.instances": str(deploy.executor_instances),
        "spark.executor.cores": str(deploy.executor_cores),
        "spark.executor.memory": deploy.executor_memory,
        **config.spark.conf,
    }
    spark = config.spark.model_copy(update={"master": master, "conf": conf})
    return config.model_copy(
        update={"spark": spark, "metrics_port": metrics_port(config), "metrics_host": "0.0.0.0"}
    )


def kubernetes_manifests(config: RouterConfig) -> list[dict[str, Any]]:
    """ServiceAccount, Role, RoleBinding (the driver starts executor pods), Secret, Service, Deployment."""
    topic = config.settings.topic
    name = object_name(topic)
    arguments = ["--topic", topic, "--config", f"{CONFIG_MOUNT}/{topic}.yaml"]
    inside = config.in_query(kubernetes_config(config.query, name))
    return _manifests(name, inside.query, {f"{topic}.yaml": settings_file(inside)}, arguments)


def group_manifests(group: str, configs: list[RouterConfig]) -> list[dict[str, Any]]:
    """The same objects for one driver archiving every topic of `configs` in one query; the Secret holds
    each topic's settings file."""
    check_group(configs)
    name = group_object_name(group)
    inside = [config.in_query(kubernetes_config(config.query, name)) for config in configs]
    arguments = ["--group", group]
    for config in configs:
        arguments += ["--topic", config.settings.topic]
    files = {f"{config.settings.topic}.yaml": settings_file(config) for config in inside}
    return _manifests(name, inside[0].query, files, [*arguments, "--topics-dir", CONFIG_MOUNT])


def pattern_manifests(
    config: DriverSettings, defaults: dict[str, Any], topic_files: dict[str, str]
) -> list[dict[str, Any]]:
    """The same objects for one query archiving every topic `config.pattern` matches (`router run
    --pattern`), topics created later included. The Secret holds the defaults (`defaults`: the endpoints
    and the defaults file, as the router reads them, with the pod's Spark settings) and the topics' own
    files (`topic_files`, by topic), mounted as `defaults.yaml` and `topics/<topic>.yaml`."""
    cleaned = "".join(c if c.isalnum() else "-" for c in config.name.lower()).strip("-")
    name = pattern_app_name(cleaned)[:63].rstrip("-")
    inside = kubernetes_config(config, name)
    pod = {
        "spark": inside.spark.model_dump(mode="json"),
        "metrics_port": inside.metrics_port,
        "metrics_host": inside.metrics_host,
        "checkpoint_location": config.checkpoint_location,
        "deploy": config.deploy.model_dump(mode="json"),
    }
    if DEFAULTS_FILE in {f"{topic}.yaml" for topic in topic_files}:
        raise ConfigError(
            f"topic {DEFAULTS_FILE.removesuffix('.yaml')}: its file would take the place of the defaults in "
            "the pod's settings; rename the topic's file or leave it out"
        )
    files = {DEFAULTS_FILE: yaml.safe_dump({**defaults, **pod}, sort_keys=False)}
    files.update({f"{topic}.yaml": text for topic, text in sorted(topic_files.items())})
    assert config.pattern is not None, "a query of named topics renders as a group"
    arguments = ["--pattern", config.pattern, "--name", config.name,
                 "--defaults", f"{CONFIG_MOUNT}/{DEFAULTS_FILE}", "--topics-dir", CONFIG_MOUNT]  # fmt: skip
    return _manifests(name, inside, files, arguments)


def _manifests(
    name: str, inside: QuerySettings, files: dict[str, str], arguments: list[str]
) -> list[dict[str, Any]]:
    """`files`: the settings files the Secret holds and the pod finds in CONFIG_MOUNT, by name."""
    deploy = inside.deploy
    port = metrics_port(inside)
    namespace = deploy.namespace
    labels = {"app.kubernetes.io/name": "bergstream-router", "app.kubernetes.io/instance": name}
    metadata = {"name": name, "namespace": namespace, "labels": labels}
    ui_port = int(inside.spark.conf.get("spark.ui.port", SPARK_UI_PORT))
    ports = [
        {"name": "metrics", "containerPort": port},
        {"name": "spark-ui", "containerPort": ui_port},
        {"name": "driver", "containerPort": DRIVER_PORT},
        {"name": "block-manager", "containerPort": BLOCK_MANAGER_PORT},
    ]
    command = ["router", "run", *arguments, "--metrics-port", str(port)]
    if deploy.workload == "SparkApplication":
        # Spark's submission names the driver's own ports; the Service reaches the router's and the UI's.
        ports = ports[:2]
        workload = _spark_application(metadata, inside, command, ports)
    else:
        workload = _deployment(metadata, inside, command, ports)
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": metadata,
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["pods", "services", "configmaps", "persistentvolumeclaims"],
                    "verbs": ["create", "get", "list", "watch", "delete", "deletecollection", "patch"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": metadata,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
        # A Secret, not a ConfigMap: the settings may hold the catalog's password and Kafka credentials.
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": metadata,
            "type": "Opaque",
            "stringData": files,
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                **metadata,
                "annotations": {
                    "prometheus.io/scrape": "true",
                    "prometheus.io/port": str(port),
                    "prometheus.io/path": "/metrics",
                },
            },
            # Headless: the name resolves to the driver pod itself, which the executors connect to.
            "spec": {
                "clusterIP": "None",
                "selector": labels,
                "ports": [
                    {"name": port["name"], "port": port["containerPort"], "targetPort": port["containerPort"]}
                    for port in ports
                ],
            },
        },
        workload,
    ]
    if deploy.monitor != "none":
        objects.append(_monitor(deploy.monitor, metadata))
    return objects


def _deployment(
    metadata: dict[str, Any],
    inside: QuerySettings,
    command: list[str],
    ports: list[dict[str, Any]],
) -> dict[str, Any]:
    """The driver as a Deployment's one pod."""
    name, labels, deploy = metadata["name"], metadata["labels"], inside.deploy
    container: dict[str, Any] = {
        "name": "router",
        "image": deploy.image,
        "args": ["bergstream", *command],
        "ports": ports,
        "resources": {
            "requests": {
                "cpu": deploy.driver_cpu,
                "memory": _with_overhead(inside.spark.conf["spark.driver.memory"]),
            }
        },
        "readinessProbe": {"httpGet": {"path": "/metrics", "port": "metrics"}, "periodSeconds": 10},
        "volumeMounts": [{"name": "settings", "mountPath": CONFIG_MOUNT, "readOnly": True}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            # One router per topic, ever: a new pod starts only after the old one stopped.
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": name,
                    "terminationGracePeriodSeconds": GRACE_SECONDS,
                    "containers": [container],
                    "volumes": [{"name": "settings", "secret": {"secretName": name}}],
                },
            },
        },
    }


def _spark_application(
    metadata: dict[str, Any],
    inside: QuerySettings,
    command: list[str],
    ports: list[dict[str, Any]],
) -> dict[str, Any]:
    """The driver as the Spark Operator's SparkApplication: the operator submits `bergstream router run`
    in cluster mode and submits it again whenever it ends. The image's entrypoint (bergstream.deploy.pod)
    starts the driver and executor pods; the driver pod carries the Service's labels and the Secret."""
    name, labels, deploy = metadata["name"], metadata["labels"], inside.deploy
    conf = inside.spark.conf
    spark_conf = {
        key: value for key, value in conf.items() if key not in _SPARK_APPLICATION_FIELDS
        and not re.search(REDACTION_REGEX, key)
    }  # fmt: skip
    driver_ports = [{"name": p["name"], "containerPort": p["containerPort"], "protocol": "TCP"}
                    for p in ports if p["name"] == "metrics"]  # fmt: skip
    return {
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "SparkApplication",
        "metadata": metadata,
        "spec": {
            "type": "Python",
            "pythonVersion": "3",
            "mode": "cluster",
            "image": deploy.image,
            "sparkVersion": _pyspark_version(),
            "mainApplicationFile": f"local://{IMAGE_SUBMIT_FILE}",
            "arguments": command,
            "sparkConf": spark_conf,
            # A router runs until it is stopped: whenever its driver ends, it is submitted again.
            "restartPolicy": {
                "type": "Always",
                "onFailureRetryInterval": 10,
                "onSubmissionFailureRetryInterval": 20,
            },
            "driver": {
                "cores": 1,
                "coreRequest": deploy.driver_cpu,
                "memory": conf["spark.driver.memory"],
                "serviceAccount": name,
                "labels": labels,
                "ports": driver_ports,
                "secrets": [{"name": name, "path": CONFIG_MOUNT, "secretType": "Generic"}],
                "terminationGracePeriodSeconds": GRACE_SECONDS,
            },
            "executor": {
                "instances": int(conf["spark.executor.instances"]),
                "cores": int(conf["spark.executor.cores"]),
                "memory": conf["spark.executor.memory"],
                "labels": labels,
            },
        },
    }


def _monitor(kind: str, metadata: dict[str, Any]) -> dict[str, Any]:
    """The Prometheus Operator's ServiceMonitor or PodMonitor of the router's metrics and Spark's (the
    driver's, its streaming queries', the executors': router.launch.SPARK_PROMETHEUS_CONF)."""
    endpoints = [
        {"port": "metrics", "path": "/metrics"},
        {"port": "spark-ui", "path": "/metrics/prometheus"},
        {"port": "spark-ui", "path": "/metrics/executors/prometheus"},
    ]
    selector = {"matchLabels": metadata["labels"]}
    spec: dict[str, Any] = {
        "selector": selector,
        "namespaceSelector": {"matchNames": [metadata["namespace"]]},
    }
    spec["endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"] = endpoints
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": kind, "metadata": metadata, "spec": spec}


def _pyspark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def _with_overhead(memory: str) -> str:
    """Spark's own default overhead on top of the JVM heap: 10%, at least 384 MiB."""
    units = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
    amount, unit = (memory[:-1], memory[-1]) if memory[-1] in units else (memory, "m")
    mib = int(int(amount) * units[unit])
    return f"{mib + max(384, mib // 10)}Mi"


class _ManifestDumper(yaml.SafeDumper):
    """Plain YAML for kubectl and for people: no anchors, multi-line strings as literal blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _string(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_ManifestDumper.add_representer(str, _string)


def manifests_yaml(manifests: list[dict[str, Any]]) -> str:
    return yaml.dump_all(manifests, Dumper=_ManifestDumper, sort_keys=False)
