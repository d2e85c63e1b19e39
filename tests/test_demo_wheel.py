"""The installed wheel runs the demo: `make demo-wheel` installs bergstream's wheel (the one the tests
build, tests/conftest.py) into a virtualenv of its own and runs `bergstream demo` in a folder outside the
checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent


def test_the_installed_wheel_runs_the_demo_with_the_java_it_ships(wheel: Path, tmp_path: Path) -> None:
    make = shutil.which("make")
    assert make, "make runs the demo-wheel target"
    # Records per topic: the demo's path end to end, in about three minutes on 2 cores.
    done = subprocess.run(
        [make, "--no-print-directory", "demo-wheel", f"DEMO_WHEEL_DIR={tmp_path}", f"DEMO_WHEEL_FILE={wheel}",
         "DEMO_COUNT=500"],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    assert "demo done in" in output, output[-5000:]
    for topic in ("playback", "impression"):
        assert f"{topic}: read 500 records, archived" in output, output[-5000:]
    assert "backfill of sessionizer" in output, output[-5000:]

    # The demo ran the installed package and the jar inside it, not the checkout's files.
    python = tmp_path / "venv" / "bin" / "python"
    environment = {
        key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")
    }
    located = subprocess.run(
        [str(python), "-c",
         "import bergstream.jars as j, bergstream.deploy as d; print(j.project_jar(), d.EXAMPLE_APPS_DIR)"],
        cwd=tmp_path / "work", env=environment, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    jar, settings = (Path(line) for line in located.stdout.split())
    site_packages = next((tmp_path / "venv" / "lib").glob("python3.*/site-packages"))
    assert jar == site_packages / "bergstream" / "jvm" / "bergstream-spark.jar"
    assert settings == site_packages / "bergstream" / "deploy" / "apps"
    assert ROOT not in jar.resolve().parents and ROOT not in settings.resolve().parents
