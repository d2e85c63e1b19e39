"""A correction whose window's start and end are crossed by sessions that main split where the live topic
lacked an event: each such session is replaced whole, on both sides of the edge, so that every event is
in one row of main, the one computed here from every event; or, where a session reaches before the rows
the backfill read, the publish is refused naming the warm-up to read, and main is left as it was.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import pytest

from bergstream.backfill.errors import BackfillConfigError
from bergstream.runtime.correct import audit as audit_module
from bergstream.runtime.correct import edges as edges_module
from bergstream.runtime.correct.audit import audit
from bergstream.runtime.correct.branch import DEFAULT_MAX_SNAPSHOT_AGE_MS, HOLD_MS, IcebergTable
from bergstream.runtime.correct.edges import staging_identifier
from bergstream.timeparse import format_duration
from tests import corrections
from tests.corrections import Edges, Killed, killed, sessions
from tests.services import Services
from tests.test_correction_histories import OUTPUT, Operator

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def edges(stack: Services, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Edges:
    return corrections.edge_plays(stack, spark, tmp_path_factory.mktemp("edges"))


def test_sessions_across_the_window_s_edges_are_replaced_whole_each_event_in_one_row(
    stack: Services,
    spark: SparkSession,
    tmp_path_factory: pytest.TempPathFactory,
    edges: Edges,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    home = tmp_path_factory.mktemp("edges_operator")
    operator = Operator(stack, spark, home, edges.scenario, window=edges.window, live_topic=edges.live_topic)
    start, end = edges.window
    minutes = timedelta(minutes=1)
    live = operator.rows("true")
    assert max(live.values()) == 1
    truth = set(sessions(edges.scenario.events).items())
    # Main as the live topic made it: account 1's session split at the window's start, 2's at its end.
    starts = {key for key, _ in live}
    assert {(1, start - 20 * minutes), (1, start + 12 * minutes)} <= starts
    assert {(2, end - 10 * minutes), (2, end + 25 * minutes)} <= starts

    # An hour's warm-up: account 4's session reaches back 80 minutes before the window's start, before the
    # rows read; the run completes, its publish is refused, naming the warm-up to read. Main is unchanged.
    operator.run("edges")
    first = operator.recorded("edges")
    assert first.complete and first.edge_refusal is not None, first
    assert f"output.warm_up to more than {format_duration(80 * minutes)}" in first.edge_refusal
    assert "account_id=4" in first.edge_refusal
    assert audit(spark, operator.identifier, first).edge_refusal == first.edge_refusal
    with pytest.raises(BackfillConfigError, match="cannot replace whole the rows that cross"):
        operator.publish("edges")
    assert operator.rows("true") == live

    # Started over with 90 minutes of warm-up: the window widened, per account, to whole sessions. Killed
    # once after main's rows beside the window left the branch, before the backfill's came; once after they
    # came, before the record said so: each time the same command again comes to the same rows.
    longer = {**OUTPUT, "warm_up": "90m"}
    for step, module in (("_append_spans", edges_module), ("repeated_keys", audit_module)):
        with monkeypatch.context() as patched:
            patched.setattr(module, step, killed)
            with pytest.raises(Killed):
                operator.run("edges", start_over=step == "_append_spans", output=longer)
        assert not operator.recorded("edges").complete
    operator.run("edges", output=longer)
    corrected = operator.recorded("edges")
    assert corrected.edge_refusal is None and corrected.edge_groups >= 4, corrected
    assert corrected.edge_start == start - 80 * minutes, corrected
    assert corrected.edge_end is not None and corrected.edge_end >= end + 55 * minutes, corrected
    report = audit(spark, operator.identifier, corrected)
    assert report.edges is not None and report.edges["groups"] == corrected.edge_groups
    # Beside the window: accounts 1, 3 and 4's sessions from before the start are longer now, 2's after
    # the end is gone into the one from the window.
    assert report.edges["counts"]["changed"] >= 3 and report.edges["counts"]["only_main"] >= 1, report.edges
    operator.publish("edges")

    main = operator.rows("true")
    assert max(main.values()) == 1, "a row twice"
    published = set(main)
    # Every session computed from every event that overlaps the window is in main, whole.
    overlapping = {(key, row) for key, row in truth if key[1] < end and row[0] > start}
    assert overlapping <= published, sorted(overlapping - published)[:5]
    # Every row of main is one the live query wrote or one computed from every event, and no two rows of an
    # account overlap: no event counted twice.
    assert published <= set(live) | truth, sorted(published - set(live) - truth)[:5]
    by_account: dict[Any, list[tuple[datetime, datetime]]] = defaultdict(list)
    for (account, first_at), row in published:
        by_account[account].append((first_at, row[0]))
    for account, spans in by_account.items():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in pairwise(spans)), (account, spans)
    # Every event of the window is in exactly one row of main.
    for event in edges.scenario.events["playback"]:
        at = event["event_ts"]
        if start <= at < end:
            holding = [span for span in by_account[event["account_id"]] if span[0] <= at < span[1]]
            assert len(holding) == 1, (event["account_id"], at, holding)
    # Main's rows beyond the widened window are the live query's, untouched.
    low, high = corrected.replaced
    far = {(key, row) for key, row in live if row[0] <= low or key[1] >= high}
    assert far <= published

    # Released, the last correction of the table: main's snapshot retention is the table's again.
    held = IcebergTable(spark, operator.identifier)
    assert held.main_snapshot_age()[1] == HOLD_MS
    removed = operator.release("edges")
    assert any("the hold on main's snapshots" in item for item in removed), removed
    assert not spark.catalog.tableExists(staging_identifier(operator.identifier, "edges"))
    assert IcebergTable(spark, operator.identifier).main_snapshot_age()[1] == DEFAULT_MAX_SNAPSHOT_AGE_MS
