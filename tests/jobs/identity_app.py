"""An application that writes each playback record it reads as it is: its partition, offset and event type."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from bergstream.runtime.app import AppRun
    from bergstream.runtime.settings import AppSettings
    from tests.services import Services


def identity(run: AppRun) -> DataFrame:
    from pyspark.sql import functions as F

    return run.sources.stream("playback").select(
        F.col("__metadata__.partition").alias("partition"),
        F.col("__metadata__.offset").alias("offset"),
        F.col("event_type"),
    )


def identity_settings(
    stack: Services, topic: str, cluster: str, checkpoint: Path, output: str, **settings: Any
) -> AppSettings:
    """The identity application over `topic` (its archive table of the same name, of `cluster`), writing
    bergstream.apps.`output`; `settings` add to or override these (mode, backfill, schema_dir, ...)."""
    from bergstream.runtime.settings import AppSettings

    source = {"topic": topic, "table": topic, "schema": "playback", "cluster": cluster}
    return AppSettings.model_validate(
        {
            "app": "identity",
            "entry": "tests.jobs.identity_app:identity",
            "sources": {"playback": source},
            "kafka": {"kafka.bootstrap.servers": stack.bootstrap_servers, "startingOffsets": "earliest"},
            "catalog": stack.catalog.model_dump(mode="json", exclude_none=True),
            "checkpoint_location": str(checkpoint),
            "output_table": output,
            "max_offsets_per_trigger": 900,
            "spark": {"master": "local[2]"},
            **settings,
        }
    )
