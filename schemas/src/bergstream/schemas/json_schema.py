"""JSON Schema beside Avro: a topic whose JSON values a schema registry describes with JSON Schema gets its
table's columns from it, and a producer of such a topic registers the JSON Schema of an Avro event schema.

Both ways go through the Avro form of an event schema (event_schema.py), which the archive layout and
the parser already understand. The subset of JSON Schema that maps onto table columns:
- an object with `properties` is a record (nested ones too); `required` names its non-null fields, and a
  property outside it, or whose type admits "null", is optional;
- "string" (with `"format": "date-time"` a timestamp, with `enum` an enum), "integer" (a 32-bit int when
  `minimum` and `maximum` keep it in that range, else a 64-bit long), "number" (double), "boolean";
- "array" with `items`, and an object with only `additionalProperties` (a map of string keys).
Anything else (`$ref`, `allOf`, tuples, several non-null types) is refused, naming the property.
"""

from __future__ import annotations

import re
from typing import Any

from bergstream.errors import ConfigError

_INT_RANGE = (-(2**31), 2**31 - 1)
_NAME = re.compile(r"[^A-Za-z0-9_]")


def avro_from_json_schema(schema: dict[str, Any], name: str) -> dict[str, Any]:
    """The Avro record that a JSON Schema of an event object describes."""
    if not isinstance(schema, dict) or _types(schema, "the schema") != ["object"]:
        raise ConfigError("a JSON Schema of events must describe an object with properties")
    return _record(schema, name, "")


def json_schema_from_avro(record: dict[str, Any]) -> dict[str, Any]:
    """The JSON Schema of the JSON form of an Avro event record (event_schema.py writes that form)."""
    converted = _json_type(record, record["name"])
    converted["title"] = record["name"]
    return converted


def _avro_name(text: str) -> str:
    cleaned = _NAME.sub("_", text) or "Event"
    return cleaned if not cleaned[0].isdigit() else f"_{cleaned}"


def _types(schema: dict[str, Any], path: str) -> list[str]:
    declared = schema.get("type")
    if declared is None and isinstance(schema.get("oneOf"), list):
        declared = []
        for branch in schema["oneOf"]:
            declared += _types(branch, path) if isinstance(branch, dict) else ["?"]
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list) and declared and all(isinstance(kind, str) for kind in declared):
        return list(declared)
    raise ConfigError(f"JSON Schema property {path or 'at the top'} has no type that maps onto a column")


def _record(schema: dict[str, Any], name: str, path: str) -> dict[str, Any]:
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not properties:
        raise ConfigError(f"JSON Schema object {path or 'at the top'} has no properties")
    required = set(schema.get("required") or [])
    fields = []
    for prop, sub in properties.items():
        where = f"{path}.{prop}" if path else prop
        if not isinstance(sub, dict):
            raise ConfigError(f"JSON Schema property {where} is not a schema")
        kinds = _types(sub, where)
        avro_type = _avro_type(_single(sub, kinds, where), where, prop)
        if prop in required and "null" not in kinds:
            fields.append({"name": prop, "type": avro_type})
        else:
            fields.append({"name": prop, "type": ["null", avro_type], "default": None})
    return {"type": "record", "name": _avro_name(schema.get("title") or name), "fields": fields}


def _single(schema: dict[str, Any], kinds: list[str], path: str) -> dict[str, Any]:
    """The non-null branch of a property: the schema itself, or its one non-null `oneOf` branch."""
    non_null = [kind for kind in kinds if kind != "null"]
    if len(non_null) != 1:
        raise ConfigError(f"JSON Schema property {path} must have one type besides null, not {kinds}")
    if "type" in schema:
        return {**schema, "type": non_null[0]}
    branches = [branch for branch in schema["oneOf"] if _types(branch, path) != ["null"]]
    return dict(branches[0])


def _avro_type(schema: dict[str, Any], path: str, hint: str) -> Any:
    kind = schema["type"]
    if kind == "string":
        if schema.get("format") == "date-time":
            return {"type": "long", "logicalType": "timestamp-millis"}
        if isinstance(schema.get("enum"), list):
            symbols = [symbol for symbol in schema["enum"] if symbol is not None]
            return {"type": "enum", "name": _avro_name(schema.get("title") or hint), "symbols": symbols}
        return "string"
    if kind == "integer":
        low, high = schema.get("minimum"), schema.get("maximum")
        if isinstance(low, int) and isinstance(high, int) and _INT_RANGE[0] <= low <= high <= _INT_RANGE[1]:
            return "int"
        return "long"
    if kind == "number":
        return "double"
    if kind == "boolean":
        return "boolean"
    if kind == "array":
        items = schema.get("items")
        if not isinstance(items, dict):
            raise ConfigError(f"JSON Schema array {path} needs one schema for its `items`")
        item_kinds = _types(items, f"{path}[]")
        element = _avro_type(_single(items, item_kinds, f"{path}[]"), f"{path}[]", hint)
        return {"type": "array", "items": ["null", element] if "null" in item_kinds else element}
    if kind == "object":
        if "properties" in schema:
            return _record(schema, schema.get("title") or hint.title(), path)
        values = schema.get("additionalProperties")
        if isinstance(values, dict):
            value_kinds = _types(values, f"{path}{{}}")
            value = _avro_type(_single(values, value_kinds, f"{path}{{}}"), f"{path}{{}}", hint)
            return {"type": "map", "values": ["null", value] if "null" in value_kinds else value}
        raise ConfigError(f"JSON Schema object {path} has neither properties nor additionalProperties")
    raise ConfigError(f"JSON Schema property {path}: type {kind!r} does not map onto a column")


def _json_type(avro_type: Any, path: str) -> dict[str, Any]:
    if isinstance(avro_type, list):
        branches = [branch for branch in avro_type if branch != "null"]
        if len(branches) != 1:
            raise ConfigError(f"Avro field {path}: only unions of null and one type have a JSON Schema")
        inner = _json_type(branches[0], path)
        if "null" not in avro_type:
            return inner
        if isinstance(inner.get("type"), str):
            return {**inner, "type": ["null", inner["type"]]}
        return {"oneOf": [{"type": "null"}, inner]}
    if isinstance(avro_type, dict):
        logical = avro_type.get("logicalType")
        if logical in ("timestamp-millis", "timestamp-micros"):
            return {"type": "string", "format": "date-time"}
        kind = avro_type.get("type")
        if kind == "record":
            properties = {}
            required = []
            for avro_field in avro_type["fields"]:
                name, field_type = avro_field["name"], avro_field["type"]
                properties[name] = _json_type(field_type, f"{path}.{name}")
                if not (isinstance(field_type, list) and "null" in field_type):
                    required.append(name)
            title = avro_type["name"]
            return {"type": "object", "title": title, "properties": properties, "required": required}
        if kind == "enum":
            return {"type": "string", "title": avro_type["name"], "enum": list(avro_type["symbols"])}
        if kind == "array":
            return {"type": "array", "items": _json_type(avro_type["items"], f"{path}[]")}
        if kind == "map":
            return {"type": "object", "additionalProperties": _json_type(avro_type["values"], f"{path}{{}}")}
        if isinstance(kind, str):
            return _json_type(kind, path)
    primitives: dict[str, dict[str, Any]] = {
        "string": {"type": "string"},
        "boolean": {"type": "boolean"},
        "int": {"type": "integer", "minimum": _INT_RANGE[0], "maximum": _INT_RANGE[1]},
        "long": {"type": "integer"},
        "float": {"type": "number"},
        "double": {"type": "number"},
    }
    if isinstance(avro_type, str) and avro_type in primitives:
        return dict(primitives[avro_type])
    raise ConfigError(f"Avro field {path}: type {avro_type!r} has no JSON Schema here")
