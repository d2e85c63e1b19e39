"""Topics planned alike share one plan of their rows and one splitter of their records, made once per Spark
context (the plan itself is Spark's, exercised by the pattern router's tests and TopicWriterTest)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bergstream.router.together import shared_plan
from bergstream.router.transform import shared_splitter
from bergstream.schemas import ArchiveLayout, load_event_schema


@dataclass
class Session:
    sparkContext: Any = field(default_factory=lambda: type("Context", (), {})())


def test_a_plan_is_made_once_per_kind_of_rows_and_context_and_never_for_a_topic_of_its_own() -> None:
    made: list[str] = []

    def plan(name: str) -> Any:
        return lambda: made.append(name) or name

    spark, other = Session(), Session()
    playback = ("playback", "{...}", "json", "us-east-1", 1024, "records", "archive", "dead letters")
    assert shared_plan(spark, playback, plan("a")) == "a"  # type: ignore[arg-type]
    assert shared_plan(spark, playback, plan("b")) == "a"  # type: ignore[arg-type]
    elsewhere = (*playback[:3], "eu-west-1", *playback[4:])
    assert shared_plan(spark, elsewhere, plan("c")) == "c"  # type: ignore[arg-type]
    assert shared_plan(other, playback, plan("d")) == "d"  # type: ignore[arg-type]
    assert shared_plan(spark, None, plan("e")) == "e"  # type: ignore[arg-type]
    assert shared_plan(spark, None, plan("f")) == "f"  # type: ignore[arg-type]
    assert made == ["a", "c", "d", "e", "f"]


def test_topics_of_one_schema_encoding_cluster_and_value_limit_share_one_splitter_whatever_their_table(
    spark: Any,
) -> None:
    playback = load_event_schema("playback")
    first = shared_splitter(ArchiveLayout(playback, "shared_a"), "json", "local", 1024)
    assert shared_splitter(ArchiveLayout(playback, "shared_b"), "json", "local", 1024) is first
    assert shared_splitter(ArchiveLayout(playback, "shared_a"), "json", "elsewhere", 1024) is not first
    assert shared_splitter(ArchiveLayout(playback, "shared_a"), "avro", "local", 1024) is not first
    assert shared_splitter(ArchiveLayout(playback, "shared_a"), "json", "local", 2048) is not first
    other = load_event_schema("impression")
    assert shared_splitter(ArchiveLayout(other, "shared_a"), "json", "local", 1024) is not first
