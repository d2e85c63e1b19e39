"""The order a replay sends an epoch's rows in, one total order, so that a resumed run can skip the
records an earlier run delivered of the epoch by counting them.

By source topic, partition and offset: records of one source partition go out in offset order, so that a
consumer of one output partition sees each key in its original order. Strictly: by ingestion time, then
topic, partition and offset. A row that a redrive killed between its two commits left both in the archive
and, unmarked, in the dead-letter table goes out once, from the archive.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bergstream.backfill.read.order import Epoch
from bergstream.backfill.read.reader import TableReader
from bergstream.schemas.archive import INGESTION_TS, METADATA

if TYPE_CHECKING:
    import pyarrow as pa

_SOURCE = ["topic", "partition", "offset"]


@dataclass(frozen=True)
class Run:
    """Consecutive rows of one table in the replay's order."""

    table: str
    rows: pa.Table


def epoch_in_order(
    readers: Sequence[TableReader], epoch: Epoch, strict: bool, dead_letter_table: str | None
) -> Iterator[Run]:
    """The rows of `epoch` from every table, in the replay's order, as runs of one table each."""
    import numpy as np
    import pyarrow as pa

    tables: list[tuple[str, pa.Table]] = []
    for reader in readers:
        # Files written by different writers read as string or large_string, binary or large_binary.
        parts = [pa.Table.from_batches([batch]) for batch in reader.read(epoch) if batch.num_rows]
        if parts:
            tables.append(
                (reader.scan.table.identifier, pa.concat_tables(parts, promote_options="permissive"))
            )
    keys = [_keys(rows, index) for index, (_, rows) in enumerate(tables)]
    archived = [key for (name, _), key in zip(tables, keys, strict=True) if name != dead_letter_table]
    for index, (name, _) in enumerate(tables):
        if name == dead_letter_table and archived:
            keys[index] = (
                keys[index]
                .join(pa.concat_tables(archived).select(_SOURCE), keys=_SOURCE, join_type="left anti")
                .select(keys[index].column_names)
            )
    if not keys:
        return
    order = ([("ts", "ascending")] if strict else []) + [(column, "ascending") for column in _SOURCE]
    merged = pa.concat_tables(keys).sort_by(order)
    owners = merged.column("table").to_numpy()
    rows = merged.column("row").to_numpy()
    run_starts = np.flatnonzero(np.diff(owners, prepend=-1))
    run_ends = np.append(run_starts[1:], len(owners))
    for begin, end in zip(run_starts, run_ends, strict=True):
        name, table = tables[int(owners[begin])]
        yield Run(name, table.take(pa.array(rows[begin:end])))


def _keys(rows: pa.Table, index: int) -> pa.Table:
    """Each row's place in the replay's order, its table (`index`) and its row number there."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    metadata = rows.column(METADATA)
    return pa.table(
        {
            "ts": pc.struct_field(metadata, INGESTION_TS).cast(pa.int64()),
            "topic": pc.struct_field(metadata, "topic").cast(pa.string()),
            "partition": pc.struct_field(metadata, "partition"),
            "offset": pc.struct_field(metadata, "offset"),
            "table": np.full(rows.num_rows, index, dtype=np.int32),
            "row": np.arange(rows.num_rows, dtype=np.int64),
        }
    )
