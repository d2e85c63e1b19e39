"""The run's Spark drivers start with the client compiler and map the class archive (tests/jvm_start.py): a
regression there costs every run minutes without failing anything else."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests import jvm_start


def test_the_run_starts_its_spark_drivers_with_the_client_compiler() -> None:
    assert "-XX:TieredStopAtLevel=1" in os.environ.get(jvm_start.OPTIONS, "").split()


@pytest.mark.integration
def test_a_driver_started_with_the_class_archive_maps_it() -> None:
    options, described = jvm_start.driver_options(make_archive=True)
    java = jvm_start.java()
    assert java is not None
    archive = jvm_start.archive_path(java)
    assert archive.exists(), described
    done = subprocess.run([sys.executable, "-m", "tests.jvm_start", "--probe"], cwd=jvm_start.ROOT,
                          env={**os.environ, jvm_start.OPTIONS: options}, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    probed = json.loads(done.stdout.splitlines()[-1])
    assert "-XX:TieredStopAtLevel=1" in probed["arguments"], probed
    assert f"-XX:SharedArchiveFile={archive}" in probed["arguments"], probed
    # The JDK's own archive alone is a few MB: mapped beside it, the run's archive is more than its file.
    assert probed["mapped"] > archive.stat().st_size, probed
