"""A plan as a person reads it: the window, the tables at their snapshots, the epochs."""

from __future__ import annotations

from bergstream.backfill.read.planner import BackfillPlan, from_micros
from bergstream.timeparse import format_duration, format_instant

# A plan of more epochs than this shows its first and last ones; --json has them all.
SHOWN_EPOCHS = 48


def plan_lines(plan: BackfillPlan) -> list[str]:
    bound = plan.policy.bound
    window = (
        f"{format_instant(from_micros(plan.window.start))} to {format_instant(from_micros(plan.window.end))}"
    )
    described = {
        "bounded": f"bounded, B = {format_duration(bound) if bound is not None else '-'}",
        "strict": "strict ingestion-time order, one reader per epoch",
        "unordered": "unordered, one epoch",
    }[plan.policy.name]
    regions = ", ".join(plan.regions) if plan.regions else "all"
    lines = [f"window {window}, {described}, regions: {regions}"]
    for scan in plan.tables:
        size = sum(split.size_bytes for split in scan.splits)
        fallbacks = sum(split.bounds_from != "manifest" for split in scan.splits)
        note = f", {fallbacks} bounded by footer or partition" if fallbacks else ""
        lines.append(
            f"  {scan.table.identifier} at snapshot {scan.snapshot_id}: {len(scan.splits)} splits, "
            f"{scan.records:,} rows, {size / 1e6:,.1f} MB{note}"
        )
    rows = sum(epoch.estimated_rows for epoch in plan.epochs)
    total_bytes = sum(epoch.estimated_bytes for epoch in plan.epochs)
    lines.append(
        f"{len(plan.epochs)} epochs (one micro-batch each), about {rows:,.0f} rows, "
        f"{total_bytes / 1e6:,.1f} MB:"
    )
    lines.append(f"  {'epoch':>6}  {'from':<27} {'to':<27} {'splits':>6} {'rows':>12} {'MB':>9}")
    epochs = list(plan.epochs)
    hidden = 0
    if len(epochs) > SHOWN_EPOCHS:
        hidden = len(epochs) - SHOWN_EPOCHS
        epochs = epochs[: SHOWN_EPOCHS // 2] + epochs[-SHOWN_EPOCHS // 2 :]
    for position, epoch in enumerate(epochs):
        if hidden and position == SHOWN_EPOCHS // 2:
            lines.append(f"  {'...':>6}  ({hidden} more epochs; --json lists them all)")
        lines.append(
            f"  {epoch.index:>6}  {format_instant(from_micros(epoch.lower)):<27} "
            f"{format_instant(from_micros(epoch.upper)):<27} {len(epoch.splits):>6} "
            f"{epoch.estimated_rows:>12,.0f} {epoch.estimated_bytes / 1e6:>9,.2f}"
        )
    return lines
