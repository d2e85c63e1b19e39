from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from bergstream.local import schema_registry as registry_server
from bergstream.local.go_install import PROMTOOL_3
from bergstream.local.processes import free_port
from bergstream.spark import build_spark_session
from tests import jvm_start
from tests.services import Services, services
from tests.skips import SkipReport
from tests.tools import build_in_background, built_with_go, needed_by

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parent.parent


# What a run writes under the temporary folder (the broker's logs, the catalogs' warehouses, Spark's scratch
# space), with room to spare: below it, the broker and Spark fail midway with errors that hide why.
NEEDED_FREE_GIB = 5
# A run of fewer integration tests than this starts few Spark drivers: the class archive, made in half a
# minute where there is none, would cost it more than it saves.
ARCHIVE_FROM = 20


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SkipReport(), "bergstream-skips")
    scratch = tempfile.gettempdir()
    free = shutil.disk_usage(scratch).free / 2**30
    if free < NEEDED_FREE_GIB:
        raise pytest.UsageError(
            f"{free:.1f} GiB free under {scratch}: the tests need {NEEDED_FREE_GIB} GiB there (a Kafka "
            "broker, catalogs, Spark's scratch space); free some and run them again"
        )


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Under xdist, the Spark drivers' settings are made by the process that starts the workers, before it
    starts them (they take the environment they start with), for a whole run."""
    if session.config.pluginmanager.has_plugin("dsession"):
        start_drivers_quicker(session.config, make_archive=True)


# What a test needs that makes it an integration test: a broker, a catalog, a Spark session, a registry.
STACK_FIXTURES = frozenset({"stack", "spark", "registry"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the stack is an integration test whether or not its module says so: `-m "not
    integration"` (make test-unit, the other Pythons' run) leaves it out. Runs before pytest's own selection
    by marker."""
    for item in items:
        if STACK_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


def pytest_collection_finish(session: pytest.Session) -> None:
    build_in_background(needed_by(session.items))
    config = session.config
    if not (hasattr(config, "workerinput") or config.pluginmanager.has_plugin("dsession")):
        integration = sum(1 for item in session.items if item.get_closest_marker("integration"))
        start_drivers_quicker(config, make_archive=integration >= ARCHIVE_FROM)


def start_drivers_quicker(config: pytest.Config, make_archive: bool) -> None:
    """The Spark drivers the run starts, started for less CPU (tests/jvm_start.py)."""
    if config.option.collectonly:
        return
    options, described = jvm_start.driver_options(make_archive)
    os.environ[jvm_start.OPTIONS] = options
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(described)


@pytest.fixture(scope="session", autouse=True)
def spark_local_dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Spark's scratch space (its copies of the jars, shuffle and spill files) for every Spark the run starts,
    in this process or in the processes it starts: in the run's own folder, removed at its end. A driver
    killed with SIGKILL cannot remove its own, 140 MB of copied jars each, which under /tmp would outlive
    every run."""
    scratch = tmp_path_factory.mktemp("spark-local")
    before = os.environ.get("SPARK_LOCAL_DIRS")
    os.environ["SPARK_LOCAL_DIRS"] = str(scratch)
    yield scratch
    if before is None:
        os.environ.pop("SPARK_LOCAL_DIRS", None)
    else:
        os.environ["SPARK_LOCAL_DIRS"] = before
    shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """One Kafka broker and one Iceberg catalog for the whole run."""
    yield from services(tmp_path_factory.mktemp("stack"))


@pytest.fixture(scope="session")
def spark(stack: Services, spark_local_dirs: Path) -> Iterator[SparkSession]:
    session = build_spark_session(
        stack.catalog,
        master="local[2]",
        app_name="bergstream-tests",
        conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"},
    )
    yield session
    session.stop()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic of its own for each test, so that tests sharing the broker do not see each other's records."""
    name: str = request.node.name
    return "t_" + "".join(c if c.isalnum() else "_" for c in name)[:80]


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bergstream's wheel, built once a run: tests/test_layout.py reads it, make demo-wheel installs it."""
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    assert uv, "uv is a dev dependency: make setup installs it"
    # Built from a copy of the files git tracks, as a clean clone has them: setuptools builds in the source
    # tree, where two builds at once (the tests of two Pythons) would spoil each other's files.
    source = tmp_path_factory.mktemp("source")
    tracked = (
        subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60)
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, tracked):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [uv, "build", "--wheel", "--out-dir", str(out), str(source)],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (built,) = out.glob("bergstream-*.whl")
    return built


@pytest.fixture(scope="session", params=["2", "3"], ids=["promtool2", "promtool3"])
def promtool(request: pytest.FixtureRequest) -> str:
    """promtool of Prometheus 2 (Debian's package) and of Prometheus 3 (built with `go install` once): the
    alert rules and scrape configurations must pass both."""
    if request.param == "2":
        found = shutil.which("promtool")
        assert found, "promtool is missing: Debian's prometheus package has it"
        return found
    return str(built_with_go(PROMTOOL_3))


@pytest.fixture(scope="module")
def registry_binary() -> Path:
    return built_with_go(registry_server.SCHEMA_REGISTRY)


@pytest.fixture(scope="module")
def registry(
    registry_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[registry_server.SchemaRegistryConfig]:
    config = registry_server.SchemaRegistryConfig(
        tmp_path_factory.mktemp("registry"), "127.0.0.1", free_port()
    )
    registry_server.start(config)
    yield config
    registry_server.stop(config)
