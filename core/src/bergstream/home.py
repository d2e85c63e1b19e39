"""The local stack's folder as every layer sees it: where it is, and the catalog the stack wrote there.

`bergstream local up` writes its catalog into `<data dir>/catalog.json`, so that library code that names
no catalog (`read_batches(...)`) finds the local stack's without importing it.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import ValidationError

from bergstream.catalog import CatalogConfig
from bergstream.errors import ConfigError
from bergstream.settings_file import problems

ENVIRONMENT = "BERGSTREAM_HOME"
CATALOG_FILE = "catalog.json"


def default_data_dir() -> Path:
    """$BERGSTREAM_HOME, else ./.bergstream."""
    return Path(os.environ.get(ENVIRONMENT, ".bergstream")).absolute()


def write_catalog(data_dir: Path, catalog: CatalogConfig) -> None:
    path = data_dir / CATALOG_FILE
    path.touch(mode=0o600)  # its properties may hold the object store's keys
    path.write_text(catalog.model_dump_json(exclude_none=True))


def read_catalog(data_dir: Path) -> CatalogConfig | None:
    """The catalog the local stack in `data_dir` wrote when it started; None if it never started."""
    path = data_dir / CATALOG_FILE
    if not path.is_file():
        return None
    try:
        return CatalogConfig.model_validate_json(path.read_text())
    except ValidationError as error:
        raise ConfigError(f"{path}: {problems(error, 'catalog.')}; start the stack again") from error
