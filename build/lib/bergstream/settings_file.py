"""Settings files: a YAML mapping read once, merged over defaults and under flags, refused as one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from bergstream.errors import ConfigError


def read_mapping(path: Path) -> dict[str, Any]:
    """The file's settings; an empty file has none."""
    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from error
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a mapping of settings, found {type(loaded).__name__}")
    return loaded or {}


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`, mapping by mapping."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def problems(error: ValidationError, prefix: str = "") -> str:
    """Every problem pydantic found, as `key.path: message`, on one line."""
    return "; ".join(
        f"{prefix}{'.'.join(str(part) for part in problem['loc']) or 'settings'}: {problem['msg']}"
        for problem in error.errors()
    )
