"""An application that writes each playback record it reads as it is: its partition, offset and event type."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from bergstream.backfill.runtime.app import AppRun


def identity(run: AppRun) -> DataFrame:
    from pyspark.sql import functions as F

    return run.sources.stream("playback").select(
        F.col("__metadata__.partition").alias("partition"),
        F.col("__metadata__.offset").alias("offset"),
        F.col("event_type"),
    )
