"""Pins: a backfill holds the snapshots it reads from expiry until it no longer needs them.

A backfill reads each table at the snapshot pinned in its plan, also when it resumes days later; Iceberg's
expiry keeps a snapshot that a tag points at. So, when a run plans (or resumes), each table gets the tag
`bergstream-backfill-<id>` at its pinned snapshot, with no maximum age, and the table property
`bergstream.backfill.<id>` says whose it is (application and checkpoint), for maintenance to name the
backfill that holds an old snapshot. The id is a digest of the checkpoint's location: one backfill, one tag
per table, which a resumed run finds again. Both go when the run completes its window, or, bootstrapped,
once it has switched to Kafka; `bergstream backfill release` drops those of a backfill given up.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from bergstream.backfill.read.planner import table_ref
from bergstream.catalog import CatalogConfig
from bergstream.schemas.archive import BACKFILL_PROPERTY_PREFIX, BACKFILL_TAG_PREFIX

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyiceberg.table import Table

    from bergstream.backfill.read.planner import BackfillPlan
    from bergstream.runtime.settings import AppSettings

    _Check = Callable[[Table], bool]
    _Commit = Callable[[Table], None]

log = logging.getLogger(__name__)
# Commits that lose to a router's concurrent append are made again on the table as it is then.
_ATTEMPTS = 10


def pin_id(checkpoint: str) -> str:
    return hashlib.sha256(checkpoint.rstrip("/").encode()).hexdigest()[:12]


def tag_of(checkpoint: str) -> str:
    return f"{BACKFILL_TAG_PREFIX}{pin_id(checkpoint)}"


def property_of(checkpoint: str) -> str:
    return f"{BACKFILL_PROPERTY_PREFIX}{pin_id(checkpoint)}"


def pin(catalog: CatalogConfig, snapshots: dict[str, int | None], checkpoint: str, app: str) -> None:
    """Tag each table (by identifier) at its snapshot for the backfill of `checkpoint`; a table with no
    snapshot has nothing to hold."""
    tag, key = tag_of(checkpoint), property_of(checkpoint)
    owner = json.dumps({"app": app, "checkpoint": checkpoint})
    for identifier, snapshot_id in sorted(snapshots.items()):
        if snapshot_id is None:
            continue

        def held(table: Table, snapshot_id: int = snapshot_id) -> bool:
            ref = table.metadata.refs.get(tag)
            return ref is not None and ref.snapshot_id == snapshot_id and table.properties.get(key) == owner

        def commit(table: Table, snapshot_id: int = snapshot_id) -> None:
            from pyiceberg.table.update.snapshot import ManageSnapshots

            transaction = table.transaction()
            transaction.set_properties({key: owner})
            refs = ManageSnapshots(transaction)
            if tag in table.metadata.refs:
                refs.remove_tag(tag)
            refs.create_tag(snapshot_id, tag).commit()
            transaction.commit_transaction()

        try:
            changed = _update(catalog, identifier, held, commit)
        except Exception as error:
            # Reading needs no pin: without one, the backfill runs while its snapshot lasts.
            log.warning(
                "%s: cannot hold snapshot %d for the backfill of %s (%s): maintenance may expire it before "
                "the backfill completes", identifier, snapshot_id, checkpoint, error,
            )  # fmt: skip
            continue
        if changed:
            log.info("%s: snapshot %d held for the backfill of %s (tag %s)", identifier, snapshot_id,
                     checkpoint, tag)  # fmt: skip


def release(catalog: CatalogConfig, tables: Iterable[str], checkpoint: str) -> list[str]:
    """Drop the tag and property of the backfill of `checkpoint` from `tables`; the tables that had them."""
    tag, key = tag_of(checkpoint), property_of(checkpoint)
    released = []
    for identifier in sorted(set(tables)):

        def gone(table: Table) -> bool:
            return tag not in table.metadata.refs and key not in table.properties

        def commit(table: Table) -> None:
            from pyiceberg.table.update.snapshot import ManageSnapshots

            transaction = table.transaction()
            if key in table.properties:
                transaction.remove_properties(key)
            if tag in table.metadata.refs:
                ManageSnapshots(transaction).remove_tag(tag).commit()
            transaction.commit_transaction()

        if _update(catalog, identifier, gone, commit):
            log.info("%s: released the snapshot held for the backfill of %s (tag %s)", identifier,
                     checkpoint, tag)  # fmt: skip
            released.append(identifier)
    return released


def release_plan(settings: AppSettings, plan: BackfillPlan) -> None:
    """Let expiry have the snapshots the run held: it reads them no more."""
    tables = [scan.table.identifier for scan in plan.tables]
    try:
        release(settings.catalog, tables, settings.checkpoint_location)
    except Exception as error:
        log.warning(
            "%s: the snapshots it read stay held (%s); `bergstream backfill release --checkpoint %s` lets "
            "maintenance expire them", settings.app, error, settings.checkpoint_location,
        )  # fmt: skip


def held_by(catalog: CatalogConfig, checkpoint: str) -> list[str]:
    """The tables of the catalog's namespace that hold snapshots for the backfill of `checkpoint`."""
    tag, key = tag_of(checkpoint), property_of(checkpoint)
    iceberg = catalog.load()
    held = []
    for identifier in iceberg.list_tables(catalog.namespace):
        table = iceberg.load_table(identifier)
        if tag in table.metadata.refs or key in table.properties:
            held.append(f"{catalog.name}.{'.'.join(identifier)}")
    return held


def _update(catalog: CatalogConfig, identifier: str, done: _Check, commit: _Commit) -> bool:
    """Commit `commit` to the table unless `done` says it is as wanted; whether a commit was made."""
    from pyiceberg.exceptions import CommitFailedException

    iceberg = catalog.load()
    name = table_ref(identifier, catalog).pyiceberg_identifier
    for attempt in range(_ATTEMPTS):
        table = iceberg.load_table(name)
        if done(table):
            return False
        try:
            commit(table)
            return True
        except CommitFailedException:
            if attempt == _ATTEMPTS - 1:
                raise
    return False
