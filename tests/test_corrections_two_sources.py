"""The correction's proof over two sources: the attribution join, its impressions with a late partition
(tests/corrections.py has the proof and the topics)."""

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
def late_impressions(
    stack: Services, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> Scenario:
    return corrections.late_impressions(stack, spark, tmp_path_factory.mktemp("attribution"))


def test_a_late_partition_of_impressions_is_corrected_over_two_sources_audited_published_and_unpublished_live(
    stack: Services,
    spark: SparkSession,
    tmp_path: Path,
    late_impressions: Scenario,
) -> None:
    correct_live(stack, spark, tmp_path, late_impressions)
