"""bergstream's image, built from the Dockerfile: it runs the whole product (`bergstream demo`: a Kafka
broker from its jars, the routers archiving two topics, a backfill over the archive), and the compose
stack's Spark master and worker start from it and find each other.

Needs a Docker engine; where Debian's docker.io is installed and no engine answers, the fixture starts
dockerd. Where the engine cannot pull debian:bookworm-slim, the base image is made with debootstrap
(deploy/docker/base-image.sh). Run by `make test-image`, not by `make test`: a first build takes minutes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.image]

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "bergstream:test"
UPSTREAM_BASE = "debian:bookworm-slim"
LOCAL_BASE = "bergstream/debian:bookworm"


def _docker(*args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done


def _engine_answers() -> bool:
    try:
        return _docker("info", timeout=20, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    if shutil.which("docker") is None:
        pytest.fail("no docker client: make test-image installs Debian's docker.io as root; install it")
    started = None
    if not _engine_answers():
        dockerd = shutil.which("dockerd")
        if dockerd is None or os.geteuid() != 0:
            pytest.fail("no Docker engine answers and none can be started here (dockerd as root)")
        log = (tmp_path_factory.mktemp("dockerd") / "dockerd.log").open("wb")
        started = subprocess.Popen([dockerd], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while not _engine_answers():
            assert started.poll() is None, f"dockerd exited with {started.returncode}; see {log.name}"
            assert time.monotonic() < deadline, f"dockerd did not answer in 60s; see {log.name}"
            time.sleep(1)
    yield
    if started is not None:
        started.terminate()
        started.wait(timeout=60)


@pytest.fixture(scope="module")
def image(engine: None) -> str:
    base = UPSTREAM_BASE
    if _docker("image", "inspect", base, check=False).returncode != 0:
        try:
            pulled = _docker("pull", base, timeout=300, check=False).returncode == 0
        except subprocess.TimeoutExpired:
            pulled = False
        if not pulled:
            made = subprocess.run(
                ["sh", str(ROOT / "deploy" / "docker" / "base-image.sh"), LOCAL_BASE],
                capture_output=True, text=True, timeout=1200, check=False,
            )  # fmt: skip
            assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
            base = LOCAL_BASE
    started = time.monotonic()
    _docker("build", "--build-arg", f"BASE_IMAGE={base}", "-t", IMAGE, str(ROOT), timeout=3600)
    print(f"built {IMAGE} from {base} in {time.monotonic() - started:.0f}s")
    return IMAGE


def test_the_image_holds_the_pinned_versions_and_runs_as_a_plain_user(image: str) -> None:
    from bergstream.jars import pinned_versions

    versions = _docker("run", "--rm", image, "bergstream", "jars", "versions").stdout
    pinned = pinned_versions()
    for version in (pinned.spark, pinned.iceberg, pinned.kafka):
        assert version in versions, versions
    assert _docker("run", "--rm", image, "id", "-u").stdout.strip() == "10001"
    # A SparkApplication's mainApplicationFile (deploy/kubernetes.py's IMAGE_SUBMIT_FILE).
    assert (
        _docker("run", "--rm", image, "test", "-f", "/opt/bergstream/submit.py", check=False).returncode == 0
    )
    # Spark's executor pods start the image with `executor` and their settings in the environment.
    bare = _docker("run", "--rm", image, "executor", check=False)
    assert bare.returncode != 0 and "SPARK_EXECUTOR_MEMORY is not set" in bare.stderr, bare.stderr


def test_the_image_runs_the_demo_archive_and_backfill(image: str) -> None:
    """The demo inside the image: a broker from the image's jars, two routers, a backfill, the summary."""
    done = _docker("run", "--rm", image, "bergstream", "demo", timeout=1800)
    out = done.stdout
    assert "playback: read 20000 records, archived" in " ".join(out.split()), out[-3000:]
    assert "impression: read 20000 records, archived" in " ".join(out.split()), out[-3000:]
    assert "demo done in" in out, out[-3000:]


def test_compose_starts_spark_master_and_worker_from_the_image(image: str, tmp_path: Path) -> None:
    from bergstream.local.processes import free_ports

    (ui_port,) = free_ports(1)
    project = f"bergstream-test-{os.getpid()}"
    env = {**os.environ, "BERGSTREAM_IMAGE": image, "SPARK_UI_PORT": str(ui_port)}
    compose = ["docker-compose", "-p", project, "-f", str(ROOT / "docker-compose.yml")]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*compose, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )

    up = run("up", "-d", "--no-build", "spark-master", "spark-worker")
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        deadline, state = time.monotonic() + 120, {}
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json", timeout=5) as answer:
                    state = json.load(answer)
            except OSError:
                state = {}
            if state.get("aliveworkers", 0) >= 1:
                break
            time.sleep(2)
        assert state.get("status") == "ALIVE", state
        assert state.get("aliveworkers") == 1, state
        assert state["url"] == "spark://spark-master:7077"
    finally:
        logs = run("logs", "--no-color")
        (tmp_path / "compose.log").write_text(logs.stdout)
        run("down", "-v")
