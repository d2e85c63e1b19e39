"""A past window corrected with a live application running: backfilled into a branch (killed once and
resumed), audited against main, published while the live query commits, unpublished, released; for the
sessionizer over one source and the attribution join over two (tests/corrections.py has the scenarios).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests import corrections
from tests.corrections import Scenario, correct_live
from tests.services import Services

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def late_plays(stack: Services, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    return corrections.late_plays(stack, spark, tmp_path_factory.mktemp("plays"))


def test_a_late_partition_s_window_is_corrected_in_a_branch_audited_published_and_unpublished_live(
    stack: Services, spark: SparkSession, tmp_path: Path, late_plays: Scenario
) -> None:
    correct_live(stack, spark, tmp_path, late_plays, own_processes=True)
