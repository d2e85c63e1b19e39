"""Release a correction: its branch, its tags, its record, and what its run kept beside them (its query's
checkpoint, the archive snapshots it held), so that nothing of it is picked up by a correction made again
under the same name. What was published stays in main.

The branch, tags and record go in one commit first: once it lands, no command finds the correction, and a
checkpoint left by a kill after it belongs to no record (a new run names a checkpoint of its own).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING

from bergstream.backfill.read.planner import table_ref
from bergstream.runtime import pins
from bergstream.runtime.checkpoint import CheckpointFiles
from bergstream.runtime.correct.branch import DEFAULT_MAX_SNAPSHOT_AGE_MS, HELD, IcebergTable, java_list
from bergstream.runtime.correct.edges import drop_staging, staging_identifier
from bergstream.runtime.correct.state import property_name
from bergstream.timeparse import format_duration

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from bergstream.catalog import CatalogConfig

log = logging.getLogger("bergstream.correct")


def release(spark: SparkSession, catalog: CatalogConfig, identifier: str, branch: str) -> list[str]:
    """Remove the correction of `branch` of `identifier` and what its run kept: what it removed, named."""
    table = IcebergTable(spark, identifier)
    correction = table.correction(branch)
    refs = table.table.refs()
    names = [str(name) for name in java_list(refs.keySet())]
    tags = [name for name in names if name.startswith(f"{branch}-before-") and not refs.get(name).isBranch()]
    transaction = table.table.newTransaction()
    manage = transaction.manageSnapshots()
    removed = []
    if table.branch_head(branch) is not None:
        manage.removeBranch(branch)
        removed.append(f"branch {branch}")
    for tag in tags:
        manage.removeTag(tag)
        removed.append(f"tag {tag}")
    restore = _held_age(table, branch)
    if restore is not None:
        manage.setMaxSnapshotAgeMs("main", restore)
        kept = format_duration(timedelta(milliseconds=restore))
        removed.append(f"the hold on main's snapshots (kept {kept} again)")
    manage.commit()
    properties = transaction.updateProperties()
    if correction is not None:
        properties.remove(property_name(branch))
        removed.append(f"the record {property_name(branch)}")
    if restore is not None:
        properties.remove(HELD)
    properties.commit()
    transaction.commitTransaction()
    table.refresh()
    if drop_staging(spark, identifier, branch):
        removed.append(f"the run's rows in {staging_identifier(identifier, branch)}")
    identity = correction.identity if correction is not None else None
    if identity is not None:
        sources = [table_ref(source, catalog).identifier for _, source in identity.sources]
        held = pins.release(catalog, sources, identity.checkpoint)
        if held:
            removed.append(f"the archive snapshots held in {', '.join(held)}")
        if CheckpointFiles(spark, identity.checkpoint).remove():
            removed.append(f"the checkpoint {identity.checkpoint}")
    log.info("%s: released %s", identifier, ", ".join(removed) or "nothing")
    return removed


def _held_age(table: IcebergTable, branch: str) -> int | None:
    """Main's max snapshot age to put back when `branch`'s is the last open correction of a table whose
    corrections hold main's snapshots (branch.py); else None."""
    held = table.property(HELD)
    keys = [str(name) for name in java_list(table.table.properties().keySet())]
    open_ = [name for name in keys if name.startswith(property_name("")) and name != property_name(branch)]
    if held is None or open_:
        return None
    if held != "unset":
        return int(held)
    return int(table.property("history.expire.max-snapshot-age-ms") or DEFAULT_MAX_SNAPSHOT_AGE_MS)
