"""Schema evolution: the topic's schema gains optional fields, the archive table gains the same columns.

Added columns cost no rewrite: Iceberg tracks columns by id and older files read them as null. Types
change only where Iceberg promotes safely (int to bigint, float to double); any other change of a field's
type is refused at start, and records whose values no longer fit go to the dead-letter table.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from pyspark.sql import SparkSession
from pyspark.sql import types as T

from bergstream.errors import ConfigError
from bergstream.schemas.archive import METADATA, METADATA_TYPE, ArchiveLayout
from bergstream.schemas.spark_types import ddl_type

log = logging.getLogger(__name__)
_PROMOTIONS = {(T.IntegerType(), T.LongType()), (T.FloatType(), T.DoubleType())}


@dataclass
class EvolutionPlan:
    additions: list[tuple[str, T.DataType]] = field(default_factory=list)
    promotions: list[tuple[str, T.DataType]] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)


def _quoted(path: list[str]) -> str:
    return ".".join(f"`{part}`" for part in path)


def plan_evolution(table: T.StructType, wanted: T.StructType, path: list[str] | None = None) -> EvolutionPlan:
    """What turns the table's columns into the wanted ones (fields missing from `wanted` stay as they are)."""
    plan = EvolutionPlan()
    prefix = path or []
    existing = {f.name: f.dataType for f in table.fields}
    for wanted_field in wanted.fields:
        where = [*prefix, wanted_field.name]
        current = existing.get(wanted_field.name)
        target = wanted_field.dataType
        if current is None:
            plan.additions.append((_quoted(where), target))
        elif isinstance(current, T.StructType) and isinstance(target, T.StructType):
            nested = plan_evolution(current, target, where)
            plan.additions += nested.additions
            plan.promotions += nested.promotions
            plan.conflicts += nested.conflicts
        elif current == target:
            continue
        elif (current, target) in _PROMOTIONS:
            plan.promotions.append((_quoted(where), target))
        else:
            plan.conflicts.append(
                f"{'.'.join(where)} is {current.simpleString()} in the table "
                f"but {target.simpleString()} in the schema"
            )
    return plan


def evolve_table(spark: SparkSession, identifier: str, layout: ArchiveLayout) -> EvolutionPlan:
    plan = plan_evolution(spark.table(identifier).schema, layout.table_type)
    if plan.conflicts:
        raise ConfigError(
            f"schema {layout.event.source} does not fit table {identifier}: {'; '.join(plan.conflicts)}. "
            "Iceberg cannot change these types in place: keep the old type, or add a field under a new name"
        )
    _apply(spark, identifier, plan)
    return plan


def evolve_metadata(spark: SparkSession, identifier: str) -> EvolutionPlan:
    """Bring the `__metadata__` struct of a table made before one of its fields was added (a dead-letter
    table: an archive table's is evolved with its event) up to date."""
    wanted = T.StructType([T.StructField(METADATA, METADATA_TYPE)])
    plan = plan_evolution(spark.table(identifier).schema, wanted)
    if plan.conflicts:
        raise ConfigError(f"table {identifier}: {'; '.join(plan.conflicts)}")
    _apply(spark, identifier, plan)
    return plan


def _apply(spark: SparkSession, identifier: str, plan: EvolutionPlan) -> None:
    for column, data_type in plan.additions:
        spark.sql(f"ALTER TABLE {identifier} ADD COLUMN {column} {ddl_type(data_type)}")
        log.info("table %s: added column %s %s", identifier, column, ddl_type(data_type))
    for column, data_type in plan.promotions:
        spark.sql(f"ALTER TABLE {identifier} ALTER COLUMN {column} TYPE {ddl_type(data_type)}")
        log.info("table %s: widened column %s to %s", identifier, column, ddl_type(data_type))
