"""The local stack's settings: where it keeps its data, and which addresses it may listen on."""

from __future__ import annotations

from pathlib import Path

import pytest

from bergstream.errors import ConfigError
from bergstream.local.stack import StackConfig


def test_a_relative_folder_is_kept_as_an_absolute_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = StackConfig(data_dir=Path("stack"))
    assert config.data_dir == tmp_path / "stack"
    assert config.catalog.warehouse == (tmp_path / "stack" / "warehouse").as_uri()


def test_a_host_off_this_machine_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="host"):
        StackConfig(data_dir=tmp_path, host="10.0.0.1")
