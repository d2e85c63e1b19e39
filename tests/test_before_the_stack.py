"""A command run before anything is set up (no local stack, no site settings) says so, and how to mend it,
before it says which settings are missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bergstream.home import ENVIRONMENT as HOME_ENVIRONMENT
from bergstream.site import ENVIRONMENT as SITE_ENVIRONMENT
from tests.commands import refused_before_spark

WINDOW = ("--start", "2026-01-01T00:00:00Z", "--end", "2026-01-01T01:00:00Z")
COMMANDS = [
    ("router", "run", "--topic", "playback"),
    ("router", "run", "--all"),
    ("router", "run", "--pattern", "play.*"),
    ("router", "maintain", "--topic", "playback"),
    ("app", "run", "--app", "sessionizer"),
    ("backfill", "run", "--app", "sessionizer", *WINDOW),
    ("backfill", "audit", "--app", "sessionizer", "--branch", "fix"),
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_command_run_before_the_stack_is_up_names_the_command_that_starts_it(
    command: tuple[str, ...], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(HOME_ENVIRONMENT, str(tmp_path / "home"))
    monkeypatch.delenv(SITE_ENVIRONMENT, raising=False)
    message = refused_before_spark(monkeypatch, *command).message
    assert message.startswith("no site settings and no local stack found"), message
    assert "start the stack with `bergstream local up`" in message, message
    assert message.count("bergstream local up") == 1, message  # once, however many topics failed
    # What is missing still follows, for a reader who meant to give it in a file.
    assert "catalog: Field required" in message, message


def test_the_command_names_the_data_dir_it_looked_in(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(SITE_ENVIRONMENT, raising=False)
    data_dir = tmp_path / "elsewhere"
    message = refused_before_spark(
        monkeypatch, "router", "run", "--topic", "playback", "--data-dir", str(data_dir)
    ).message
    assert f"`bergstream local up --data-dir {data_dir}`" in message, message


def test_with_site_settings_a_missing_setting_is_said_as_it_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(json.dumps({"kafka": {"kafka.bootstrap.servers": "127.0.0.1:9"}}))
    monkeypatch.setenv(SITE_ENVIRONMENT, str(site))
    monkeypatch.setenv(HOME_ENVIRONMENT, str(tmp_path / "home"))
    message = refused_before_spark(monkeypatch, "app", "run", "--app", "sessionizer").message
    assert "catalog: Field required" in message, message
    assert "local up" not in message, message
