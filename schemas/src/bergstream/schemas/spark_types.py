"""Avro schemas as Spark SQL types, and Spark SQL types as DDL."""

from __future__ import annotations

from typing import Any

from pyspark.sql import types as T

from bergstream.errors import ConfigError

_PRIMITIVES: dict[str, T.DataType] = {
    "string": T.StringType(),
    "boolean": T.BooleanType(),
    "int": T.IntegerType(),
    "long": T.LongType(),
    "float": T.FloatType(),
    "double": T.DoubleType(),
    "bytes": T.BinaryType(),
}
_LOGICAL: dict[str, T.DataType] = {
    "timestamp-millis": T.TimestampType(),
    "timestamp-micros": T.TimestampType(),
    "date": T.DateType(),
}


def avro_to_spark(avro_type: Any, path: str = "") -> tuple[T.DataType, bool]:
    """The Spark type of an Avro type, and whether it admits null (a union with "null")."""
    if isinstance(avro_type, list):
        branches = [branch for branch in avro_type if branch != "null"]
        if len(branches) != 1:
            raise ConfigError(
                f"field {path}: only unions of null and one type are supported, not {avro_type}"
            )
        spark_type, _ = avro_to_spark(branches[0], path)
        return spark_type, "null" in avro_type
    if isinstance(avro_type, str):
        if avro_type in _PRIMITIVES:
            return _PRIMITIVES[avro_type], False
        raise ConfigError(f"field {path}: unsupported Avro type {avro_type!r}")
    logical = avro_type.get("logicalType")
    if logical in _LOGICAL:
        return _LOGICAL[logical], False
    kind = avro_type.get("type")
    if kind == "record":
        return record_to_struct(avro_type, path), False
    if kind == "enum":
        return T.StringType(), False
    if kind == "array":
        element, element_nullable = avro_to_spark(avro_type["items"], f"{path}[]")
        return T.ArrayType(element, element_nullable), False
    if kind == "map":
        value, value_nullable = avro_to_spark(avro_type["values"], f"{path}{{}}")
        return T.MapType(T.StringType(), value, value_nullable), False
    if isinstance(kind, str) and kind in _PRIMITIVES:
        return _PRIMITIVES[kind], False
    raise ConfigError(f"field {path}: unsupported Avro type {avro_type!r}")


def record_to_struct(record: dict[str, Any], path: str = "") -> T.StructType:
    fields = []
    for avro_field in record["fields"]:
        name = avro_field["name"]
        spark_type, nullable = avro_to_spark(avro_field["type"], f"{path}.{name}" if path else name)
        fields.append(T.StructField(name, spark_type, nullable))
    return T.StructType(fields)


def ddl_type(data_type: T.DataType) -> str:
    if isinstance(data_type, T.StructType):
        members = ", ".join(
            f"`{f.name}`: {ddl_type(f.dataType)}{'' if f.nullable else ' NOT NULL'}" for f in data_type.fields
        )
        return f"STRUCT<{members}>"
    if isinstance(data_type, T.ArrayType):
        return f"ARRAY<{ddl_type(data_type.elementType)}>"
    if isinstance(data_type, T.MapType):
        return f"MAP<{ddl_type(data_type.keyType)}, {ddl_type(data_type.valueType)}>"
    return data_type.simpleString().upper()


def ddl_columns(schema: T.StructType) -> str:
    return ",\n  ".join(
        f"`{f.name}` {ddl_type(f.dataType)}{'' if f.nullable else ' NOT NULL'}" for f in schema.fields
    )


def optional(data_type: T.DataType) -> T.DataType:
    """The same type with every field and element nullable."""
    if isinstance(data_type, T.StructType):
        return T.StructType([T.StructField(f.name, optional(f.dataType), True) for f in data_type.fields])
    if isinstance(data_type, T.ArrayType):
        return T.ArrayType(optional(data_type.elementType), True)
    if isinstance(data_type, T.MapType):
        return T.MapType(data_type.keyType, optional(data_type.valueType), True)
    return data_type


def nested_fields(struct: T.StructType, prefix: str = "") -> list[tuple[str, T.StructField]]:
    """Every field of `struct` and of the structs inside it, with its dotted path."""
    found = []
    for struct_field in struct.fields:
        path = f"{prefix}{struct_field.name}"
        found.append((path, struct_field))
        if isinstance(struct_field.dataType, T.StructType):
            found += nested_fields(struct_field.dataType, f"{path}.")
    return found


def avro_enums(record: dict[str, Any], prefix: str = "") -> dict[str, list[str]]:
    """The symbols of every enum field of an Avro record (nested records included), by dotted path."""
    enums: dict[str, list[str]] = {}
    for avro_field in record["fields"]:
        path = f"{prefix}{avro_field['name']}"
        branches = avro_field["type"] if isinstance(avro_field["type"], list) else [avro_field["type"]]
        for branch in branches:
            if isinstance(branch, dict) and branch.get("type") == "enum":
                enums[path] = list(branch["symbols"])
            elif isinstance(branch, dict) and branch.get("type") == "record":
                enums.update(avro_enums(branch, f"{path}."))
    return enums
