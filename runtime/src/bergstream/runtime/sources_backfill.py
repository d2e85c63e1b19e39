"""A backfill's sources: each source's archive table read by the `bergstream-backfill` source in
lateness-bounded order, all of them on one plan, so that they advance on one ingestion watermark.

The plan is made once and kept beside the query's checkpoint (PLAN_FILE): a restarted backfill reads the
snapshots it started on, which a tag per table holds from expiry meanwhile (runtime/pins.py), and a checkpoint
asked for another backfill is refused. A bootstrap plans the same way, with more to it (sources_bootstrap.py):
the hooks below are where it differs.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from bergstream.backfill.errors import CheckpointMismatch
from bergstream.backfill.read.order import OrderingPolicy, StrictOrder, Window, ordering
from bergstream.backfill.read.planner import BackfillPlan, plan, table_ref
from bergstream.runtime.pins import pin, tag_of
from bergstream.runtime.sources import BACKFILL_FORMAT, PLAN_DIR, PLAN_FILE, Sources

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger("bergstream.runtime.sources")


class BackfillSources(Sources):
    """A backfill's sources: the archive tables over the window its settings give."""

    _plan: BackfillPlan | None = None

    def _stream(self, name: str) -> DataFrame:
        backfill_plan = self.plan()
        table = table_ref(self.settings.sources[name].table_or_topic, self.settings.catalog).identifier
        path = f"{PLAN_DIR}/{name}.json"
        self.files.write_text(path, json.dumps(backfill_plan.source_plan(table, name)))
        return self.spark.readStream.format(BACKFILL_FORMAT).option("plan", self.files.uri(path)).load()

    def plan(self) -> BackfillPlan:
        """The plan every source of this run reads: made once, then read from the checkpoint."""
        if self._plan is None:
            self._plan = self._pinned_plan()
        return self._plan

    def _pinned_plan(self) -> BackfillPlan:
        settings = self.settings
        backfill = settings.backfill
        assert backfill.start is not None, "validated by AppSettings"
        tables = [source.table_or_topic for source in settings.sources.values()]
        policy = ordering(backfill.max_misalignment, backfill.strict)
        window = self._window()
        files = self.files
        # As the checkpoint's name has them: the same regions in another order are the same request.
        regions = sorted(backfill.regions) if backfill.regions is not None else None
        request: dict[str, Any] = {
            "tables": sorted(table_ref(t, settings.catalog).identifier for t in tables),
            "window": [window.start, window.end],
            "ordering": policy.name,
            "bound_us": None if policy.bound is None else policy.bound // timedelta(microseconds=1),
            "regions": regions,
        }
        if isinstance(policy, StrictOrder):
            # Its epochs' width: a strict checkpoint of another width counts its epochs on another grid.
            request["epoch_us"] = policy.max_misalignment // timedelta(microseconds=1)
        self._asked(request)
        snapshots: dict[str, int | None] | None = None
        pinned: dict[str, Any] | None = None
        if files.exists(PLAN_FILE):
            pinned = json.loads(files.read_text(PLAN_FILE))
            if pinned["request"] != request:
                raise CheckpointMismatch(
                    f"checkpoint {settings.checkpoint_location} belongs to another backfill "
                    f"({_describe(pinned['request'])}) than this one ({_describe(request)}): "
                    "give this backfill a checkpoint of its own"
                )
            snapshots = pinned["snapshots"]
            self._resumed(pinned)
            log.info("resuming %s %s from its plan in %s", settings.mode, settings.app, files.uri(PLAN_FILE))
        else:
            snapshots = self._first_snapshots()
        backfill_plan = self._planned(tables, window, policy, request["regions"], snapshots, pinned)
        document: dict[str, Any] = dict(pinned) if pinned is not None else {
            "request": request,
            "snapshots": {scan.table.identifier: scan.snapshot_id for scan in backfill_plan.tables},
            "tag": tag_of(settings.checkpoint_location),
        }  # fmt: skip
        self._kept(document, backfill_plan)
        if document != pinned:
            files.write_text(PLAN_FILE, json.dumps(document))
        self._hold({scan.table.identifier: scan.snapshot_id for scan in backfill_plan.tables})
        return backfill_plan

    def _window(self) -> Window:
        """The window the run reads."""
        from bergstream.backfill.read.batches import window_of

        backfill = self.settings.backfill
        assert backfill.start is not None and backfill.end is not None, "validated by AppSettings"
        return window_of(backfill.start, backfill.end)

    def _asked(self, request: dict[str, Any]) -> None:
        """What the run asks of its plan, completed in place (a checkpoint of another request is refused)."""

    def _resumed(self, pinned: dict[str, Any]) -> None:
        """The plan kept beside the checkpoint, read again at a restart."""

    def _first_snapshots(self) -> dict[str, int | None] | None:
        """The snapshots a first run plans on, per table: None, each table's newest."""
        return None

    def _planned(
        self,
        tables: list[str],
        window: Window,
        policy: OrderingPolicy,
        regions: list[str] | None,
        snapshots: dict[str, int | None] | None,
        pinned: dict[str, Any] | None,
    ) -> BackfillPlan:
        """The plan over `tables` at `snapshots`; `pinned`, the plan kept beside the checkpoint, if any."""
        return plan(self.settings.catalog, tables, window, policy, regions, snapshots)

    def _kept(self, document: dict[str, Any], backfill_plan: BackfillPlan) -> None:
        """What the plan kept beside the checkpoint holds, completed in place."""

    def _hold(self, snapshots: dict[str, int | None]) -> None:
        """The plan's snapshots held from expiry while the run reads them."""
        settings = self.settings
        pin(settings.catalog, snapshots, settings.checkpoint_location, settings.app)


def _describe(request: dict[str, Any]) -> str:
    start, end = request["window"]
    return f"tables {', '.join(request['tables'])}, window {start}-{end} us, {request['ordering']}"
