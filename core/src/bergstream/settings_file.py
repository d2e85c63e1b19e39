"""Settings files: a YAML mapping read once, merged over defaults and under flags, refused as one line."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BeforeValidator, ValidationError

from bergstream.errors import ConfigError


def option_string(value: Any) -> Any:
    """An option of Spark, Kafka or a catalog written as a YAML number or boolean, as the string they take:
    `maxOffsetsPerTrigger: 25000` is "25000", `failOnDataLoss: false` is "false". Anything else is left to
    be refused as not a string."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value


# The value of an option handed on as a string (Spark's settings, its Kafka source's, a catalog's).
OptionValue = Annotated[str, BeforeValidator(option_string)]


# `${NAME}` in a value: the environment variable's value, so that a secret (a catalog's password, a
# registry's login, a JAAS configuration) need not be written into the file.
_ENVIRONMENT_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def read_mapping(path: Path) -> dict[str, Any]:
    """The file's settings, each `${NAME}` in a text value replaced by the environment variable's value;
    an empty file has none."""
    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from error
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a mapping of settings, found {type(loaded).__name__}")
    settings: dict[str, Any] = _from_environment(loaded or {}, path, "")
    return settings


def _from_environment(value: Any, path: Path, key: str) -> Any:
    if isinstance(value, dict):
        return {name: _from_environment(item, path, f"{key}{name}.") for name, item in value.items()}
    if isinstance(value, list):
        return [_from_environment(item, path, key) for item in value]
    if not isinstance(value, str) or "${" not in value:
        return value

    def variable(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in os.environ:
            raise ConfigError(
                f"{path}: {key.rstrip('.') or 'a value'} names the environment variable {name}, which is not "
                "set; set it, or write the value"
            )
        return os.environ[name]

    return _ENVIRONMENT_REFERENCE.sub(variable, value)


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`, mapping by mapping."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def without_none(values: dict[str, Any]) -> dict[str, Any]:
    """`values` less the unset ones (None), mapping by mapping; a mapping left empty goes too."""
    cleaned: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            value = without_none(value)
            if value:
                cleaned[key] = value
        elif value is not None:
            cleaned[key] = value
    return cleaned


def layered(
    path: Path, name_key: str, name: str, defaults: dict[str, Any], overrides: dict[str, Any]
) -> dict[str, Any]:
    """A topic's or an application's settings, from weakest to strongest: `defaults` (the site settings or
    the local stack), the file at `path` (which must exist: the caller has refused a missing one), and
    `overrides` (the flags; unset ones are left out). The file names its topic or application under
    `name_key`, if at all, as `name`."""
    from_file = read_mapping(path)
    if from_file.get(name_key, name) != name:
        raise ConfigError(f"{path}: {name_key} is {from_file[name_key]!r} but {name!r} was asked for")
    if "catalog" in from_file:  # another catalog entirely: nothing of the defaults' one may leak into it
        defaults = {key: value for key, value in defaults.items() if key != "catalog"}
    merged = merge(merge(defaults, from_file), without_none(overrides))
    merged.setdefault(name_key, name)
    return merged


def problems(error: ValidationError, prefix: str = "", flat: frozenset[str] = frozenset()) -> str:
    """Every problem pydantic found, as `key.path: message`, on one line. `flat`: the model's fields whose
    keys a file has at its top level (a topic's file holds its query's settings beside its own)."""

    def where(loc: tuple[int | str, ...]) -> str:
        if len(loc) > 1 and loc[0] in flat:
            loc = loc[1:]
        return ".".join(str(part) for part in loc) or "settings"

    return "; ".join(f"{prefix}{where(problem['loc'])}: {problem['msg']}" for problem in error.errors())
