"""Every skip of a run, listed at its end; a skip that is not expected here fails the run.

A test skips only when something it needs is absent and `make` cannot install it. Listing the skips that
may happen, with the reason each may give, keeps "skip when absent" from hiding an install step that broke:
a tool `make` installs, when missing, is a skip that matches no entry, and the run fails saying so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class ExpectedSkip:
    """Tests whose node id starts with `test` may skip with a reason that `reason` (a regular expression)
    finds."""

    test: str
    reason: str

    def matches(self, nodeid: str, reason: str) -> bool:
        return nodeid.startswith(self.test) and re.search(self.reason, reason) is not None


EXPECTED = (
    # Burrow 1.9.5 or newer is in none of the registries `make` installs from (Debian has 1.2.1, too old for
    # Kafka 4); a user who has one points BERGSTREAM_BURROW at it. A BERGSTREAM_BURROW that is wrong fails.
    ExpectedSkip(
        "tests/test_burrow.py::test_burrow_judges_", r"Burrow was not found on the PATH|Burrow older"
    ),
    # The refusal of Debian's Burrow 1.2.1 runs where that package is installed; `make` does not install it.
    ExpectedSkip("tests/test_burrow.py::test_a_burrow_too_old_", r"Debian's burrow package is not installed"),
    # Go is the one tool README asks for that `make` cannot install (Debian's is older than the programs
    # need): the tests of the Go-built parts skip where no Go of the version they need is on the PATH. A
    # Go that is there and fails to build them fails them.
    ExpectedSkip("tests/", r"'go' was not found on PATH|needs Go \d+\.\d+ or newer"),
    # A tmpfs is mounted only as root (CI runs as root, so it runs there).
    ExpectedSkip("tests/test_outages.py::test_a_warehouse_read_only_then_full_", r"needs root"),
)


@dataclass(frozen=True)
class Skipped:
    nodeid: str
    reason: str
    expected: bool


class SkipReport:
    """The pytest plugin: collects the skips, prints them, fails the run on an unexpected one."""

    def __init__(self, expected: tuple[ExpectedSkip, ...] = EXPECTED) -> None:
        self.expected = expected
        self.skipped: list[Skipped] = []

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not report.skipped or hasattr(report, "wasxfail"):
            return
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        expected = any(entry.matches(report.nodeid, reason) for entry in self.expected)
        self.skipped.append(Skipped(report.nodeid, reason, expected))

    @property
    def unexpected(self) -> list[Skipped]:
        return [skip for skip in self.skipped if not skip.expected]

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.unexpected and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl(trylast=True)  # after the durations: the run's report ends with its skips
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        terminalreporter.section("skipped tests")
        if not self.skipped:
            terminalreporter.line("none")
            return
        for skip in self.skipped:
            mark = "expected" if skip.expected else "UNEXPECTED"
            terminalreporter.line(f"{mark}: {skip.nodeid}: {skip.reason}")
        if self.unexpected:
            terminalreporter.line(
                f"{len(self.unexpected)} skip(s) not in tests/skips.py's EXPECTED fail this run: install "
                "what they name (make should have), or add the skip there with the reason it may happen",
                red=True,
            )
