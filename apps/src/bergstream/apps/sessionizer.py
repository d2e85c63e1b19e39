"""The playback sessionizer of Netflix's backfill talk: each account's plays, grouped into sessions.

A session is a run of an account's playback events with no gap longer than `gap` in event time; it is
written once the watermark (the newest event time seen less `watermark_delay`) has passed its end. An
event later than the watermark is dropped, as a live job drops it: the backfill's bound B must stay
within the delay for the backfill to see what the live job saw.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import functions as F

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from bergstream.runtime.app import AppRun

DEFAULTS = {"gap": "30 minutes", "watermark_delay": "1 hour"}


def sessionizer(run: AppRun) -> DataFrame:
    options = {**DEFAULTS, **run.options}
    plays = run.sources.stream("playback")
    session = F.session_window("event_ts", options["gap"])
    return (
        plays.withWatermark("event_ts", options["watermark_delay"])
        .groupBy("account_id", session)
        .agg(
            F.count("*").alias("events"),
            F.count(F.when(F.col("event_type") == "START", 1)).alias("plays"),
            F.max("view_duration_sec").alias("longest_view_sec"),
            F.min("__metadata__.kafka_ingestion_ts").alias("first_ingestion_ts"),
        )
        .select(
            "account_id",
            F.col("session_window.start").alias("session_start"),
            F.col("session_window.end").alias("session_end"),
            "events",
            "plays",
            "longest_view_sec",
            "first_ingestion_ts",
        )
    )
