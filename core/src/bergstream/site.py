"""Site settings: the endpoints that every router and application of one deployment shares.

`BERGSTREAM_SITE=/etc/bergstream/site.yaml` names a YAML file of defaults, weaker than a topic's or an
application's own file and than the flags. A deployment (the compose stack, a Kubernetes namespace) writes
its Kafka address, catalog and checkpoint root there once, and deploy/topics/<topic>.yaml stays the same
file everywhere. When it is set, the local stack (`bergstream local up`) is not consulted.

    kafka:                       # options of every Kafka source, with Spark's names
      kafka.bootstrap.servers: kafka:9092
    catalog: {type: rest, uri: http://rest-catalog:8181, warehouse: s3://archive/warehouse}
    checkpoint_root: /var/lib/bergstream   # <root>/checkpoints/<topic>, <root>/apps/<app>
    spark: {master: spark://spark-master:7077}
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from bergstream.catalog import CatalogConfig
from bergstream.errors import ConfigError
from bergstream.settings_file import problems, read_mapping

ENVIRONMENT = "BERGSTREAM_SITE"
KEYS = ("kafka", "catalog", "checkpoint_root", "spark", "schema_registry")


def site_file() -> Path | None:
    """The site settings file named by the environment, if any; it must exist."""
    named = os.environ.get(ENVIRONMENT)
    if not named:
        return None
    path = Path(named)
    if not path.is_file():
        raise ConfigError(f"{ENVIRONMENT}={named}: no such file; unset it or point it at the site settings")
    return path


def read_site(path: Path) -> dict[str, Any]:
    settings = read_mapping(path)
    unknown = sorted(set(settings) - set(KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown site setting {', '.join(unknown)}; known: {', '.join(KEYS)}")
    root = settings.get("checkpoint_root")
    if root is not None and not (isinstance(root, str) and (root.startswith("/") or "://" in root)):
        raise ConfigError(f"{path}: checkpoint_root {root!r} must be an absolute path or a URI")
    for key in ("kafka", "catalog", "spark", "schema_registry"):
        if key in settings and not isinstance(settings[key], dict):
            raise ConfigError(f"{path}: {key} must be a mapping of settings")
    return settings


def _defaults(path: Path, checkpoint: str) -> dict[str, Any]:
    settings = read_site(path)
    defaults = {key: value for key, value in settings.items() if key != "checkpoint_root"}
    if "checkpoint_root" in settings:
        defaults["checkpoint_location"] = f"{settings['checkpoint_root'].rstrip('/')}/{checkpoint}"
    return defaults


def router_defaults(path: Path, topic: str) -> dict[str, Any]:
    """A topic's router defaults from the site file: its checkpoint is <root>/checkpoints/<topic>."""
    return _defaults(path, f"checkpoints/{topic}")


def app_defaults(path: Path, app: str) -> dict[str, Any]:
    """An application's defaults from the site file: its checkpoint is <root>/apps/<app>."""
    defaults = _defaults(path, f"apps/{app}")
    defaults.pop("schema_registry", None)
    return defaults


def site_catalog(path: Path) -> CatalogConfig | None:
    """The catalog the site settings name, validated, if they name one."""
    settings = read_site(path)
    if "catalog" not in settings:
        return None
    try:
        return CatalogConfig.model_validate(settings["catalog"])
    except ValidationError as error:
        raise ConfigError(f"{path}: {problems(error, 'catalog.')}") from error
