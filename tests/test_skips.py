"""A run lists its skips at the end and fails on one that tests/skips.py does not expect; a test that needs a
Go program skips, naming the Go it needs, only where no such Go is on the PATH."""

from __future__ import annotations

import re
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from bergstream.errors import BergstreamError, MissingToolError
from bergstream.local import burrow
from bergstream.local.go_install import PROMTOOL_3, GoProgram, require_go
from bergstream.local.object_store import VERSITYGW
from bergstream.local.schema_registry import SCHEMA_REGISTRY
from tests.skips import EXPECTED
from tests.tools import build_in_background, built_with_go, needed_by

pytest_plugins = ["pytester"]

INNER_CONFTEST = """
from tests.skips import ExpectedSkip, SkipReport

def pytest_configure(config):
    config.pluginmanager.register(
        SkipReport((ExpectedSkip("test_inner.py::test_absent_tool", r"frobnicator .* not found"),)), "skips"
    )
"""


def run_inner(pytester: pytest.Pytester, body: str) -> pytest.RunResult:
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makepyfile(test_inner=body)
    return pytester.runpytest_inprocess("-p", "no:cacheprovider")


def test_an_expected_skip_is_listed_and_the_run_passes(pytester: pytest.Pytester) -> None:
    result = run_inner(pytester, """
import pytest

def test_absent_tool():
    pytest.skip("frobnicator 2 was not found on the PATH")

def test_runs():
    pass
""")  # fmt: skip
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([
        "*skipped tests*",
        "expected: test_inner.py::test_absent_tool: frobnicator 2 was not found on the PATH",
    ])  # fmt: skip


def test_a_skip_nobody_expected_fails_the_run_naming_it(pytester: pytest.Pytester) -> None:
    result = run_inner(pytester, """
import pytest

@pytest.mark.skipif(True, reason="prometheus is missing")
def test_rules():
    pass

def test_absent_tool():
    pytest.skip("frobnicator was installed but would not start")
""")  # fmt: skip
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "*skipped tests*",
        "UNEXPECTED: test_inner.py::test_rules: prometheus is missing",
        "UNEXPECTED: test_inner.py::test_absent_tool: frobnicator was installed but would not start",
        "2 skip(s) not in tests/skips.py's EXPECTED fail this run*",
    ])  # fmt: skip


def test_a_failure_stays_the_run_s_status_and_a_run_without_skips_says_none(
    pytester: pytest.Pytester,
) -> None:
    result = run_inner(pytester, "def test_fails():\n    assert False\n")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*skipped tests*", "none"])


def fake_go(folder: Path, version: str) -> None:
    """A `go` that tells its version and fails every build."""
    folder.mkdir(exist_ok=True)
    go = folder / "go"
    go.write_text(f"#!/bin/sh\n[ \"$1 $2\" = 'env GOVERSION' ] && echo {version} && exit 0\n"
                  "echo 'go: example.org/frob@v1.0.0: 403 Forbidden' >&2; exit 1\n")  # fmt: skip
    go.chmod(go.stat().st_mode | stat.S_IXUSR)


def expected(nodeid: str, reason: str) -> bool:
    return any(entry.matches(nodeid, reason) for entry in EXPECTED)


def test_no_go_and_a_go_too_old_are_expected_skips_and_a_failed_build_is_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BERGSTREAM_CACHE", str(tmp_path / "cache"))
    program = GoProgram("frob", "example.org/frob/cmd/frob", "1.25", version="v1.0.0")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(pytest.skip.Exception) as absent:
        built_with_go(program)
    assert "'go' was not found on PATH" in str(absent.value)
    assert expected("tests/test_object_store.py::test_x", str(absent.value))

    fake_go(tmp_path / "old", "go1.19.8")
    monkeypatch.setenv("PATH", str(tmp_path / "old"))
    with pytest.raises(pytest.skip.Exception) as old:
        built_with_go(program)
    assert str(old.value).endswith("is go1.19.8; building frob needs Go 1.25 or newer")
    assert expected("tests/test_schema_registry.py::test_x", str(old.value))

    fake_go(tmp_path / "new", "go1.26.8")
    monkeypatch.setenv("PATH", str(tmp_path / "new"))
    assert require_go("1.25", "frob") == str(tmp_path / "new" / "go")
    failure = re.escape("for frob failed: go: example.org/frob@v1.0.0: 403 Forbidden")
    with pytest.raises(BergstreamError, match=failure):
        built_with_go(program)
    assert not program.installed()


def test_a_missing_burrow_is_an_expected_skip_and_a_wrong_burrow_variable_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    burrow_test = (
        "tests/test_burrow.py::test_burrow_judges_the_router_ok_while_it_archives_and_lagging_once_it_stops"
    )
    monkeypatch.delenv(burrow.BINARY_VARIABLE, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(MissingToolError) as absent:
        burrow.burrow_binary()
    assert expected(burrow_test, str(absent.value))
    assert expected(burrow_test, f"/usr/bin/Burrow: {burrow.TOO_OLD}")
    monkeypatch.setenv(burrow.BINARY_VARIABLE, str(tmp_path / "nothing"))
    with pytest.raises(MissingToolError) as wrong:
        burrow.burrow_binary()
    assert not expected(burrow_test, str(wrong.value))
    # The same reasons from any other test are not expected.
    assert not expected("tests/test_router.py::test_x", str(absent.value))


def test_every_expected_skip_names_tests_that_exist() -> None:
    root = Path(__file__).parent.parent
    for entry in EXPECTED:
        path, _, name = entry.test.partition("::")
        assert (root / path).exists(), entry
        assert not name or f"def {name}" in (root / path).read_text(), entry


def test_the_run_builds_the_go_programs_its_tests_need_in_the_background_in_the_order_they_need_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def item(*fixtures: str, **params: object) -> SimpleNamespace:
        return SimpleNamespace(fixturenames=list(fixtures), callspec=SimpleNamespace(params=params))

    items = [item("stack", "counts", counts={"a": 1}), item("promtool", promtool="2"),
             item("registry_binary", "registry"), item("stack", "promtool", promtool="3"),
             SimpleNamespace(fixturenames=["versitygw"]), item("registry_binary")]  # fmt: skip
    assert needed_by(items) == [SCHEMA_REGISTRY, PROMTOOL_3, VERSITYGW]  # type: ignore[arg-type]

    monkeypatch.setenv("BERGSTREAM_CACHE", str(tmp_path / "cache"))
    fake_go(tmp_path / "old", "go1.21.0")
    monkeypatch.setenv("PATH", str(tmp_path / "old"))
    first, second = (GoProgram(name, f"example.org/{name}/cmd/{name}", "1.26", version="v1.0.0")
                     for name in ("frob", "knob"))  # fmt: skip
    build_in_background([first, second])
    for program in (second, first):
        with pytest.raises(pytest.skip.Exception, match=f"building {program.name} needs Go 1.26 or newer"):
            built_with_go(program)
