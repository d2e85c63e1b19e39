"""How many tasks write a batch, from what its predecessor read."""

from __future__ import annotations

import pytest

from bergstream.router.write import write_tasks_for


@pytest.mark.parametrize(
    ("previous_read", "tasks"),
    [(None, 8), (0, 1), (1, 1), (20_000, 1), (20_001, 2), (60_000, 3), (1_000_000, 8)],
)
def test_one_task_per_records_the_previous_batch_read(previous_read: int | None, tasks: int) -> None:
    assert write_tasks_for(previous_read, most=8, records_per_task=20_000) == tasks
