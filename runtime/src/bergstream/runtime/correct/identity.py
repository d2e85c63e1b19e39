"""A correction's identity: everything its branch's rows depend on, and the run that writes them.

A branch holds the rows of one run of the application: one read window (the window widened by the output's
warm-up and settle), one order, one set of regions, one entry with its options and sources, written by one
query (its checkpoint, named from the run). `backfill run --branch` again with the same settings resumes
that run; with other settings it is refused naming what changed, or, asked to start over, releases the
branch and begins another run. Rows of two runs never meet in one branch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from bergstream.runtime.checkpoint_names import ordering_name
from bergstream.runtime.settings import AppSettings
from bergstream.timeparse import format_instant


@dataclass(frozen=True)
class Identity:
    read_start: datetime
    read_end: datetime
    ordering: str  # 15m, strict, unordered
    regions: tuple[str, ...] | None
    entry: str
    options: str  # the application's options, as canonical JSON
    sources: tuple[tuple[str, str], ...]  # (name, archive table), by name
    checkpoint: str
    run: str

    def to_json(self) -> dict[str, Any]:
        document = asdict(self)
        document.update(
            read_start=self.read_start.isoformat(), read_end=self.read_end.isoformat(),
            regions=list(self.regions) if self.regions is not None else None,
            sources=[list(pair) for pair in self.sources],
        )  # fmt: skip
        return document

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> Identity:
        return cls(
            read_start=datetime.fromisoformat(document["read_start"]).astimezone(UTC),
            read_end=datetime.fromisoformat(document["read_end"]).astimezone(UTC),
            ordering=document["ordering"],
            regions=tuple(document["regions"]) if document.get("regions") is not None else None,
            entry=document["entry"], options=document["options"],
            sources=tuple((name, table) for name, table in document["sources"]),
            checkpoint=document["checkpoint"], run=document["run"],
        )  # fmt: skip


def new_run() -> str:
    """A run's name: when it began, to the microsecond (a checkpoint's name takes it as it is)."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")


def identity_of(settings: AppSettings) -> Identity:
    """The identity of the correction `settings` ask for: settings of a correction (settings.correction),
    its run named and its checkpoint chosen."""
    backfill, correct = settings.backfill, settings.backfill.correct
    assert correct is not None and correct.run is not None, "a correction's run is named before it starts"
    assert backfill.start is not None and backfill.end is not None
    return Identity(
        read_start=backfill.start, read_end=backfill.end, ordering=ordering_name(backfill),
        regions=tuple(sorted(backfill.regions)) if backfill.regions is not None else None,
        entry=settings.entry, options=json.dumps(settings.options, sort_keys=True, default=str),
        sources=tuple(sorted((name, source.table_or_topic) for name, source in settings.sources.items())),
        checkpoint=settings.checkpoint_location, run=correct.run,
    )  # fmt: skip


def differences(recorded: Identity, requested: Identity, checkpoint_given: bool) -> list[str]:
    """What the `requested` run would compute otherwise than the `recorded` one, each naming its setting;
    the checkpoint only when it was given (by default, a resumed run takes the recorded one)."""
    found = []
    if recorded.read_start != requested.read_start:
        found.append(
            "the read window's start (the window's start less output.warm_up): "
            f"{format_instant(recorded.read_start)} recorded, {format_instant(requested.read_start)} now"
        )
    if recorded.read_end != requested.read_end:
        found.append(
            "the read window's end (the window's end plus output.settle): "
            f"{format_instant(recorded.read_end)} recorded, {format_instant(requested.read_end)} now"
        )
    if recorded.ordering != requested.ordering:
        found.append(
            f"the order (--max-misalignment, --strict, --unordered): {recorded.ordering} recorded, "
            f"{requested.ordering} now"
        )
    if recorded.regions != requested.regions:
        found.append(f"the regions (--region): {_regions(recorded.regions)} recorded, "
                     f"{_regions(requested.regions)} now")  # fmt: skip
    if recorded.entry != requested.entry:
        found.append(f"entry: {recorded.entry} recorded, {requested.entry} now")
    if recorded.options != requested.options:
        was, now = json.loads(recorded.options), json.loads(requested.options)
        changed = sorted(name for name in {*was, *now} if was.get(name) != now.get(name))
        each = (f"{name} {was.get(name)!r} recorded, {now.get(name)!r} now" for name in changed)
        found.append(f"options: {', '.join(each)}")
    if recorded.sources != requested.sources:
        found.append(f"sources: {_sources(recorded.sources)} recorded, {_sources(requested.sources)} now")
    if checkpoint_given and recorded.checkpoint != requested.checkpoint:
        found.append(f"--checkpoint: {recorded.checkpoint} recorded, {requested.checkpoint} now")
    return found


def _regions(regions: tuple[str, ...] | None) -> str:
    return ", ".join(regions) if regions is not None else "every region"


def _sources(sources: tuple[tuple[str, str], ...]) -> str:
    return ", ".join(f"{name} from {table}" for name, table in sources)
