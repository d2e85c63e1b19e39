"""Backfill: read archive tables back in lateness-bounded order, several sources aligned.

The roles are those of Iceberg's Flink source: `split` (a unit of work), `order` (the ordering policy that
makes epochs), `planner` (finding splits with pyiceberg), `reader` (a split's rows of an epoch).
"""

from bergstream.backfill.read.batches import read_batches

__all__ = ["read_batches"]
