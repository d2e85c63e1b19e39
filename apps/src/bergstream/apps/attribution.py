"""Impression to playback attribution, the talk's real-time merchandising application: take rate per title.

Every impression is joined to the plays it led to: a START of the same account and title within
`attribution_window` after it. Per title and hour of impressions, the application writes how many
impressions there were, how many led to a play, and the take rate. It reads two sources, impressions
with ten times the events of playbacks: in a backfill they advance on one ingestion watermark, so that
neither side's join state grows with the other's lead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import functions as F

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from bergstream.runtime.app import AppRun

DEFAULTS = {"attribution_window": "30 minutes", "watermark_delay": "1 hour", "period": "1 hour"}


def attribution(run: AppRun) -> DataFrame:
    options = {**DEFAULTS, **run.options}
    delay = options["watermark_delay"]
    impressions = (
        run.sources.stream("impression")
        .select("impression_id", "account_id", "show_id", F.col("event_ts").alias("impression_ts"))
        .withWatermark("impression_ts", delay)
    )
    plays = (
        run.sources.stream("playback")
        .where(F.col("event_type") == "START")
        .select(
            "playback_id",
            F.col("account_id").alias("play_account_id"),
            F.col("show_id").alias("play_show_id"),
            F.col("event_ts").alias("play_ts"),
        )
        .withWatermark("play_ts", delay)
    )
    attributed = impressions.join(
        plays,
        F.expr(
            "account_id = play_account_id AND show_id = play_show_id AND play_ts >= impression_ts "
            f"AND play_ts <= impression_ts + interval {options['attribution_window']}"
        ),
        "leftOuter",
    )
    per_title = attributed.groupBy(F.window("impression_ts", options["period"]), "show_id").agg(
        F.count("*").alias("impressions"), F.count("playback_id").alias("plays")
    )
    return per_title.select(
        F.col("window.start").alias("period_start"),
        F.col("window.end").alias("period_end"),
        "show_id",
        "impressions",
        "plays",
        (F.col("plays") / F.col("impressions")).alias("take_rate"),
    )
