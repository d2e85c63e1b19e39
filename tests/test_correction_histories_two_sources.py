"""A correction over two sources (the attribution join: impressions with a late partition, and the plays they
lead to) after a bad day: one source's router behind while the other's is not, then a run killed after its
last batch and run again. It ends with main's window the take rates computed here from every archived event
of both topics, each once, or with a refusal that changes nothing (tests/test_correction_histories.py has
the histories over one source)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from bergstream.backfill.errors import BackfillConfigError
from bergstream.runtime.correct.audit import audit
from tests import corrections
from tests.services import Services
from tests.test_correction_histories import Operator

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("two_source_histories")


@pytest.fixture(scope="module")
def operator(stack: Services, spark: SparkSession, home: Path) -> Operator:
    scenario = corrections.late_impressions(stack, spark, home, name="history_impressions")
    return Operator(stack, spark, home, scenario)


def test_a_correction_over_two_sources_waits_for_each_router_and_is_exact_after_a_kill(
    operator: Operator, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plays of one partition in Kafka and not yet archived, every impression archived: the window's rows
    need them, and the correction is refused naming that partition of the plays alone. Archived, the run is
    killed after its last batch and run again: the branch holds the true take rates, once; published, so
    does main's window, and main beyond it is the live query's."""
    scenario, start = operator.scenario, operator.scenario.start
    plays, impressions = scenario.topics["playback"], scenario.topics["impression"]
    late = corrections.send(operator.stack.bootstrap_servers, plays, "playback", 1,
                            corrections.spread(start + timedelta(hours=6), timedelta(minutes=1), 20), 77,
                            corrections.any_account)  # fmt: skip
    settled = {**operator.output_settings, "settle": "270m"}
    with pytest.raises(BackfillConfigError, match="does not hold every event ingested before") as refused:
        operator.run("fix", output=settled)
    message = str(refused.value)
    assert f"topic {plays} partition 1 of cluster local: the router is at offset" in message, message
    assert f"topic {impressions} " not in message and f"topic {plays} partition 0" not in message, message
    assert operator.recorded_or_none("fix") is None, "a branch was made"

    scenario.events["playback"].extend(late)
    corrections.archive(operator.stack, operator.spark, plays, "playback", home / "plays", len(late))
    operator.run_killed_after_last_batch("fix", monkeypatch, output=settled)
    operator.run("fix", output=settled)
    ended = operator.recorded("fix")
    assert ended.complete and ended.watermark is not None and ended.watermark >= ended.end, ended
    assert operator.branch_rows("fix") == operator.expected
    assert audit(operator.spark, operator.identifier, ended).duplicated == 0
    operator.publish("fix")
    assert operator.rows(operator.in_window) == operator.expected
    operator.assert_kept_beyond("fix")
