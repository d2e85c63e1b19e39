"""The correction's proof over two sources: the attribution join, its impressions with a late partition
(test_corrections.py has the proof and the topics)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.services import Services
from tests.test_corrections import Scenario, correct_live, late_impressions  # noqa: F401 (a fixture)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration


def test_a_late_partition_of_impressions_is_corrected_over_two_sources_audited_published_and_unpublished_live(
    stack: Services,
    spark: SparkSession,
    tmp_path: Path,
    late_impressions: Scenario,  # noqa: F811
) -> None:
    correct_live(stack, spark, tmp_path, late_impressions)
