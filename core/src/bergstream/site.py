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
    topics_dir: /etc/bergstream/topics     # <topic>.yaml; relative to this file (default: deploy/topics)
    apps_dir: /etc/bergstream/apps         # <app>.yaml (default: deploy/apps)
    topic_defaults: /etc/bergstream/topic-defaults.yaml  # `router run --pattern`: a topic without its file
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from bergstream.catalog import CatalogConfig
from bergstream.errors import ConfigError
from bergstream.home import default_data_dir, read_catalog
from bergstream.settings_file import problems, read_mapping

ENVIRONMENT = "BERGSTREAM_SITE"
KEYS = (
    "kafka", "catalog", "checkpoint_root", "spark", "schema_registry", "topics_dir", "apps_dir",
    "topic_defaults",
)  # fmt: skip
# Where the settings files are, not settings of a router or an application.
_FOLDERS = ("topics_dir", "apps_dir", "topic_defaults")


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
    for key in _FOLDERS:
        if key in settings and not isinstance(settings[key], str):
            raise ConfigError(f"{path}: {key} must be a path")
    return settings


def _defaults(path: Path, checkpoint: str) -> dict[str, Any]:
    settings = read_site(path)
    defaults = {key: value for key, value in settings.items() if key not in ("checkpoint_root", *_FOLDERS)}
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


def default_catalog() -> CatalogConfig:
    """The catalog of code that names none: the site's when BERGSTREAM_SITE is set, else the one the local
    stack in $BERGSTREAM_HOME (or ./.bergstream) wrote when it started."""
    site = site_file()
    if site is not None:
        catalog = site_catalog(site)
        if catalog is None:
            raise ConfigError(f"{site}: names no catalog; add one, or pass the catalog")
        return catalog
    data_dir = default_data_dir()
    catalog = read_catalog(data_dir)
    if catalog is None:
        raise ConfigError(
            f"no catalog named: none in {data_dir} (start the local stack with `bergstream local up`), "
            f"and {ENVIRONMENT} is not set; pass the catalog, or set {ENVIRONMENT} to the site settings"
        )
    return catalog


def settings_dir(named: Path | None, environment: str, key: str, default: Path) -> Path:
    """Where a kind of settings file is kept: the folder named (a flag), else $<environment>, else the
    site settings' <key> (relative to the site file), else <default> under the working directory."""
    if named is not None:
        return named
    from_environment = os.environ.get(environment)
    if from_environment:
        return Path(from_environment)
    site = site_file()
    if site is not None:
        folder = read_site(site).get(key)
        if folder is not None:
            return site.parent / str(folder)
    return Path.cwd() / default


def site_topic_defaults() -> Path | None:
    """The settings file of the topics that have none of their own (`router run --pattern`), as the site
    settings name it (relative to the site file); None without."""
    site = site_file()
    if site is None:
        return None
    named = read_site(site).get("topic_defaults")
    return None if named is None else site.parent / str(named)
