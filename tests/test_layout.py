"""The layout: one installed package, one source root per top-level folder, and layers that hold."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _pyproject() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as file:
        return tomllib.load(file)


def _setup_roots() -> dict[str, str | tuple[str, ...]]:
    """setup.py's ROOTS, read without running setup()."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "ROOTS" for target in node.targets
        ):
            roots: dict[str, str | tuple[str, ...]] = ast.literal_eval(node.value)
            return roots
    raise AssertionError("setup.py has no ROOTS")


def _source_roots() -> list[str]:
    return [f"{folder}/src" for folder in _setup_roots()]


def test_every_tool_reads_the_same_source_roots() -> None:
    roots = _source_roots()
    project = _pyproject()
    tools = project["tool"]
    assert tools["mypy"]["mypy_path"] == roots
    assert tools["mypy"]["files"] == roots
    assert tools["pytest"]["ini_options"]["pythonpath"] == roots
    assert tools["pyright"]["extraPaths"] == roots
    assert [root for root in tools["ruff"]["src"] if root != "."] == roots
    makefile = (ROOT / "Makefile").read_text()
    assert f"SOURCE_ROOTS := {':'.join(roots)}\n" in makefile, (
        "the Makefile's SOURCE_ROOTS differ from setup.py's"
    )
    for root in roots:
        assert (ROOT / root / "bergstream").is_dir(), f"{root} holds no part of the bergstream namespace"
        assert not (ROOT / root / "bergstream" / "__init__.py").exists(), (
            f"{root}/bergstream/__init__.py would make bergstream a regular package and hide the other roots"
        )


def test_each_root_holds_only_the_packages_it_names() -> None:
    """A package put into a root that does not name it would not be installed."""
    for folder, tops in _setup_roots().items():
        named = {tops} if isinstance(tops, str) else set(tops)
        base = ROOT / folder / "src" / "bergstream"
        if "bergstream" in named:
            continue
        found = {f"bergstream.{path.name}" for path in base.iterdir() if path.name != "__pycache__"}
        assert found == named, (
            f"{folder}/src/bergstream holds {sorted(found)}, setup.py names {sorted(named)}"
        )


def _layers() -> list[str]:
    contract = _pyproject()["tool"]["importlinter"]["contracts"][0]
    return [module.strip() for layer in contract["layers"] for module in layer.replace("|", ":").split(":")]


def test_every_module_of_bergstream_is_in_a_layer() -> None:
    """A module left out of the contract would escape it."""
    layered = set(_layers())
    core = ROOT / "core" / "src" / "bergstream"
    tops = {f"bergstream.{path.stem}" for path in core.glob("*.py")}
    for tops_of_root in _setup_roots().values():
        tops |= {tops_of_root} if isinstance(tops_of_root, str) else set(tops_of_root)
    tops.discard("bergstream")
    assert tops - layered == set(), "modules of bergstream in no layer of [tool.importlinter]"
    assert layered - tops == set(), "layers that name no module of bergstream"


def test_the_layers_hold() -> None:
    """lint-imports checks the contract over every source root (the editable install's finder hides all
    but one of them from a walk of the namespace, so the roots are given on PYTHONPATH)."""
    lint_imports = Path(sys.executable).parent / "lint-imports"
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / root) for root in _source_roots())}
    done = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=ROOT, env=environment, capture_output=True, text=True,
        check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "broken" in done.stdout and "0 broken" in done.stdout, done.stdout[-3000:]
    # Every source root was analysed, not only the first one found.
    analysed = int(done.stdout.split("Analyzed ")[1].split(" files")[0])
    assert analysed >= sum(1 for root in _source_roots() for _ in (ROOT / root).rglob("*.py"))


def test_the_wheel_installs_one_top_level_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (top_level,) = [name for name in names if name.endswith(".dist-info/top_level.txt")]
        assert archive.read(top_level).decode().split() == ["bergstream"]
        (metadata,) = [name for name in names if name.endswith(".dist-info/METADATA")]
        requires = [
            line for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist")
        ]
    # Ranges, not pins: bergstream installs beside a platform's own pyspark (constraints.txt pins).
    assert requires and not [line for line in requires if "==" in line.split(";")[0]], requires
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"bergstream"}
    for module in (
        "bergstream/spark.py", "bergstream/__main__.py", "bergstream/cli/__init__.py",
        "bergstream/router/driver/query.py", "bergstream/backfill/read/planner.py",
        "bergstream/runtime/run.py", "bergstream/schemas/parse.py",
        "bergstream/apps/sessionizer.py", "bergstream/deploy/render.py", "bergstream/local/stack.py",
        "bergstream/loadgen/producer.py",
        "bergstream/jvm/pom.xml", "bergstream/schemas/avro/playback.avsc",
        "bergstream/deploy/prometheus/alerts.yml", "bergstream/deploy/grafana/bergstream-router.json",
        "bergstream/jvm/bergstream-spark.jar",
        "bergstream/deploy/apps/sessionizer.yaml", "bergstream/deploy/topics/playback.yaml",
    ):  # fmt: skip
        assert module in names, f"the wheel lacks {module}"


def test_the_wheel_ships_bergstreams_java_built(wheel: Path, tmp_path: Path) -> None:
    """Maven builds the jar from schemas/jvm, router/jvm and backfill/jvm when the wheel is built."""
    with zipfile.ZipFile(wheel) as archive:
        (tmp_path / "bergstream-spark.jar").write_bytes(archive.read("bergstream/jvm/bergstream-spark.jar"))
    with zipfile.ZipFile(tmp_path / "bergstream-spark.jar") as jar:
        names = set(jar.namelist())
        service = jar.read("META-INF/services/org.apache.spark.sql.sources.DataSourceRegister").decode()
    assert service.split() == ["io.bergstream.backfill.BackfillSource", "io.bergstream.backfill.HybridSource"]
    for part in ("schemas", "router", "backfill"):
        for source in (ROOT / part / "jvm" / "src" / "main" / "java").rglob("*.java"):
            compiled = source.relative_to(source.parents[3]).with_suffix(".class").as_posix()
            assert compiled in names, f"the shipped jar lacks {compiled}"
