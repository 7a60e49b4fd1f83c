"""A small JSON Schema validator: the subset `vectors.schema.json` uses, so verify checks a
bundle's manifest against the shipped schema itself (the one statement of the format) without a
dependency. Keywords: type, enum, const, properties, required, additionalProperties (bool or
schema), propertyNames, items, minItems, maxItems, minimum, maximum, maxLength, pattern, $ref to
``#/$defs/NAME``; others are ignored (the test suite checks the same manifests with the
``jsonschema`` package, so the subset cannot drift from the standard unnoticed)."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["SchemaError", "validate"]

_TYPES: dict[str, Any] = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "null": type(None),
}


class SchemaError(ValueError):
    """The instance does not match: one line, the JSON path and what is wrong."""


def _is(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPES[kind])


def validate(
    instance: Any, schema: dict[str, Any], root: dict[str, Any] | None = None, path: str = "$"
) -> None:
    """Raise `SchemaError` at the first place ``instance`` breaks ``schema``."""
    root = schema if root is None else root
    if "$ref" in schema:
        ref = schema["$ref"]
        if not ref.startswith("#/$defs/"):
            raise SchemaError(f"{path}: unsupported $ref {ref!r}")
        validate(instance, root["$defs"][ref.split("/")[-1]], root, path)
    if "type" in schema:
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is(instance, k) for k in kinds):
            raise SchemaError(f"{path}: expected {' or '.join(kinds)}, got {type(instance).__name__}")
    if "const" in schema and instance != schema["const"]:
        raise SchemaError(f"{path}: expected {schema['const']!r}, got {_short(instance)}")
    if "enum" in schema and instance not in schema["enum"]:
        raise SchemaError(f"{path}: {_short(instance)} is not one of {schema['enum']}")
    if isinstance(instance, str):
        if "maxLength" in schema and len(instance) > schema["maxLength"]:
            raise SchemaError(f"{path}: longer than {schema['maxLength']} characters")
        if "pattern" in schema and not re.search(_ecma(schema["pattern"]), instance):
            raise SchemaError(f"{path}: {_short(instance)} does not match {schema['pattern']}")
    if _is(instance, "number"):
        if "minimum" in schema and instance < schema["minimum"]:
            raise SchemaError(f"{path}: {instance} is less than {schema['minimum']}")
        if "maximum" in schema and instance > schema["maximum"]:
            raise SchemaError(f"{path}: {instance} is more than {schema['maximum']}")
    if isinstance(instance, list):
        if "maxItems" in schema and len(instance) > schema["maxItems"]:
            raise SchemaError(f"{path}: more than {schema['maxItems']} items")
        if "minItems" in schema and len(instance) < schema["minItems"]:
            raise SchemaError(f"{path}: fewer than {schema['minItems']} items")
        if "items" in schema:
            for i, item in enumerate(instance):
                validate(item, schema["items"], root, f"{path}[{i}]")
    if isinstance(instance, dict):
        for key in schema.get("required", ()):
            if key not in instance:
                raise SchemaError(f"{path}: missing required key {key!r}")
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, value in instance.items():
            if "propertyNames" in schema:
                validate(key, schema["propertyNames"], root, f"{path} key {key!r}")
            if key in props:
                validate(value, props[key], root, f"{path}.{key}")
            elif extra is False:
                raise SchemaError(f"{path}: unexpected key {_short(key)}")
            elif isinstance(extra, dict):
                validate(value, extra, root, f"{path}.{key}")


def _ecma(pattern: str) -> str:
    """A pattern as JSON Schema means it (ECMA-262): a final ``$`` matches at the very end only,
    where Python's also matches before a final newline ("a.safetensors\\n" would pass)."""
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        return pattern[:-1] + r"\Z"
    return pattern


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."
