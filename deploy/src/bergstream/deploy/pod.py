"""The image's entrypoint, for the pods Spark starts on Kubernetes from bergstream's image.

Spark on Kubernetes starts its pods with a first argument that says their role, and hands the rest in the
environment: `executor` (a router's executors, under a Deployment or a SparkApplication) and `driver` (the
driver pod a SparkApplication's submission makes). bergstream's image is no Spark distribution, so this
module turns those into the Java and spark-submit commands of pyspark's own Spark in the image. Any other
command (`bergstream router run ...`, a shell) runs as given.

    python -m bergstream.deploy.pod executor
    python -m bergstream.deploy.pod driver --properties-file ... local:///.../submit.py router run ...
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from bergstream import jars
from bergstream.errors import ConfigError
from bergstream.spark import jvm_start_conf

EXECUTOR_BACKEND = "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend"
# What Spark's executor pod step puts in the environment, each to the backend's flag.
_EXECUTOR_FLAGS = {
    "SPARK_DRIVER_URL": "--driver-url",
    "SPARK_EXECUTOR_ID": "--executor-id",
    "SPARK_EXECUTOR_CORES": "--cores",
    "SPARK_APPLICATION_ID": "--app-id",
    "SPARK_EXECUTOR_POD_IP": "--hostname",
}
_JAVA_OPTION = re.compile(r"^SPARK_JAVA_OPT_(\d+)$")


def _required(environment: Mapping[str, str], name: str, role: str) -> str:
    value = environment.get(name)
    if not value:
        raise ConfigError(
            f"{role} pod: {name} is not set; Spark on Kubernetes sets it when it starts the pod "
            "(run the image's other commands with their own arguments)"
        )
    return value


def executor_command(environment: Mapping[str, str], spark_jars: Path, java: str = "java") -> list[str]:
    """The executor's JVM: Spark's Kubernetes executor backend, with the memory, Java options, class path
    and identity the driver gave the pod."""
    memory = _required(environment, "SPARK_EXECUTOR_MEMORY", "executor")
    options = sorted(
        (
            (int(match.group(1)), value)
            for name, value in environment.items()
            if (match := _JAVA_OPTION.match(name))
        ),
    )
    class_path = [f"{spark_jars}/*", *filter(None, [environment.get("SPARK_CLASSPATH")])]
    command = [java, f"-Xms{memory}", f"-Xmx{memory}", *(value for _, value in options), "-cp",
               os.pathsep.join(class_path), EXECUTOR_BACKEND]  # fmt: skip
    for variable, flag in _EXECUTOR_FLAGS.items():
        command += [flag, _required(environment, variable, "executor")]
    command += ["--resourceProfileId", environment.get("SPARK_RESOURCE_PROFILE_ID") or "0"]
    if environment.get("SPARK_EXECUTOR_POD_NAME"):
        command += ["--podName", environment["SPARK_EXECUTOR_POD_NAME"]]
    return command


def driver_command(environment: Mapping[str, str], arguments: list[str], spark_submit: str) -> list[str]:
    """The driver pod of a submission: spark-submit in client mode inside the pod, as Spark's own images do,
    with bergstream's jars of this image and the JVM options its sessions start with."""
    bind_address = environment.get("SPARK_DRIVER_BIND_ADDRESS") or "0.0.0.0"
    conf = {
        "spark.driver.bindAddress": bind_address,
        **jvm_start_conf(local=False),
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
    }
    command = [spark_submit, "--deploy-mode", "client"]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    return command + arguments


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: python -m bergstream.deploy.pod executor | driver ARGS... | COMMAND ARGS...")
    role, arguments = argv[0], argv[1:]
    environment = dict(os.environ)
    try:
        if role == "executor":
            java_home = environment.get("JAVA_HOME")
            java = str(Path(java_home) / "bin" / "java") if java_home else (shutil.which("java") or "java")
            command = executor_command(environment, jars.spark_home_jars(), java)
        elif role == "driver":
            command = driver_command(environment, arguments, shutil.which("spark-submit") or "spark-submit")
        else:
            command = argv
    except ConfigError as error:
        raise SystemExit(f"bergstream pod: {error}") from None
    sys.stdout.flush()
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
