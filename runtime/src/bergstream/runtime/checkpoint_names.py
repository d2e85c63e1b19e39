"""The checkpoint each run of an application gets beside its live one: a bootstrap's from a time, a backfill's
and a correction's, named from what makes the run another query (its window, its order, its regions, its
branch and run), so that the same command resumes the same run and no run starts from another's."""

from __future__ import annotations

import re
from datetime import datetime

from bergstream.runtime.settings import UNORDERED, AppSettings, BackfillSettings
from bergstream.timeparse import format_duration


def bootstrap_checkpoint(settings: AppSettings) -> str:
    """The checkpoint of an application bootstrapped from a time: the live query it becomes keeps it, so
    the same command resumes it in either phase; another time, or another bound, is another query."""
    backfill = settings.backfill
    assert backfill.start is not None
    name = re.sub(r"[^A-Za-z0-9-]", "-", f"{backfill.start:%Y%m%dT%H%M%S%f}_{ordering_name(backfill)}")
    return f"{settings.checkpoint_location.rstrip('/')}-from-{name}"


def ordering_name(backfill: BackfillSettings) -> str:
    """The order a backfill reads in, as a checkpoint's name and a correction's record say it."""
    if backfill.strict:
        return "strict"
    return UNORDERED if backfill.max_misalignment is None else format_duration(backfill.max_misalignment)


def backfill_checkpoint(settings: AppSettings) -> str:
    """A checkpoint of its own for each backfill request, beside the live one: the same command resumes
    the same backfill, and no backfill ever starts from the live query's checkpoint or another's. A
    correction's is named from its run too: the same branch made again is another query."""
    backfill = settings.backfill
    assert backfill.start is not None and backfill.end is not None
    correct = backfill.correct
    parts = [
        _instant_name(backfill.start),
        _instant_name(backfill.end),
        ordering_name(backfill),
        *sorted(backfill.regions or []),
        *([f"branch-{correct.branch}"] if correct is not None else []),
        *([f"run-{correct.run}"] if correct is not None and correct.run is not None else []),
    ]
    name = "_".join(re.sub(r"[^A-Za-z0-9-]", "-", part) for part in parts)
    return f"{settings.checkpoint_location.rstrip('/')}-backfill-{name}"


def _instant_name(instant: datetime) -> str:
    """An instant in a checkpoint's name, to the microsecond where it has one: two windows, two names."""
    return instant.strftime("%Y%m%dT%H%M%S") + (instant.strftime("%f") if instant.microsecond else "")
