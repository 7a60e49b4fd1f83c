"""A small JSON Schema validator: the subset `vectors.schema.json` uses, so verify checks a
bundle's manifest against the shipped schema itself (the one statement of the format) without a
dependency. Keywords: type, enum, const, properties, required, additionalProperties (bool or
schema), propertyNames, items, minItems, maxItems, minimum, maximum, maxLength, pattern, $ref to
``#/$defs/NAME``; others are ignored (the test suite checks the same manifests with the
``jsonschema`` package, so the subset cannot drift from the standard unnoticed).

A schema is compiled once into nested checks (`compile_schema`), each doing only what its
keywords ask: a manifest of a thousand cases validates in milliseconds.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

__all__ = ["SchemaError", "compile_schema", "validate"]

Check = Callable[[Any, str], None]


class SchemaError(ValueError):
    """The instance does not match: one line, the JSON path and what is wrong."""


#: JSON type -> the Python types json.loads gives it
_PY_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "null": (type(None),),
    "integer": (int,),
    "number": (int, float),
}


def _is(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    return isinstance(value, _PY_TYPES[kind])


def validate(instance: Any, schema: dict[str, Any]) -> None:
    """Raise `SchemaError` at the first place ``instance`` breaks ``schema``."""
    compile_schema(schema)(instance, "$")


def compile_schema(
    schema: dict[str, Any], root: dict[str, Any] | None = None, cache: dict[str, Check] | None = None
) -> Check:
    """``schema`` as one function ``check(instance, path)`` raising `SchemaError`."""
    root = schema if root is None else root
    cache = {} if cache is None else cache
    checks: list[Check] = []
    if "$ref" in schema:
        checks.append(_ref(schema["$ref"], root, cache))
    if "type" in schema:
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        types = tuple({t for k in kinds for t in _PY_TYPES[k]})
        no_bool = "boolean" not in kinds  # bool is an int in Python, never a number in JSON

        def check_type(x: Any, path: str) -> None:
            if not isinstance(x, types) or (no_bool and isinstance(x, bool)):
                raise SchemaError(f"{path}: expected {' or '.join(kinds)}, got {type(x).__name__}")

        checks.append(check_type)
    if "const" in schema:

        def check_const(x: Any, path: str, want: Any = schema["const"]) -> None:
            if x != want:
                raise SchemaError(f"{path}: expected {want!r}, got {_short(x)}")

        checks.append(check_const)
    if "enum" in schema:

        def check_enum(x: Any, path: str, allowed: list[Any] = schema["enum"]) -> None:
            if x not in allowed:
                raise SchemaError(f"{path}: {_short(x)} is not one of {allowed}")

        checks.append(check_enum)
    if "maxLength" in schema or "pattern" in schema:
        checks.append(_string(schema))
    if "minimum" in schema or "maximum" in schema:
        checks.append(_number(schema))
    if any(k in schema for k in ("items", "maxItems", "minItems")):
        checks.append(_array(schema, root, cache))
    if any(k in schema for k in ("required", "properties", "additionalProperties", "propertyNames")):
        checks.append(_object(schema, root, cache))
    if len(checks) == 1:
        return checks[0]

    def check_all(x: Any, path: str) -> None:
        for c in checks:
            c(x, path)

    return check_all


def _ref(ref: str, root: dict[str, Any], cache: dict[str, Check]) -> Check:
    if not ref.startswith("#/$defs/"):
        raise SchemaError(f"unsupported $ref {ref!r}")

    def check_ref(x: Any, path: str) -> None:
        if ref not in cache:  # compiled on first use: definitions may refer to each other
            cache[ref] = compile_schema(root["$defs"][ref.split("/")[-1]], root, cache)
        cache[ref](x, path)

    return check_ref


def _string(schema: dict[str, Any]) -> Check:
    longest = schema.get("maxLength")
    pattern = re.compile(_ecma(schema["pattern"])) if "pattern" in schema else None

    def check_string(x: Any, path: str) -> None:
        if not isinstance(x, str):
            return
        if longest is not None and len(x) > longest:
            raise SchemaError(f"{path}: longer than {longest} characters")
        if pattern is not None and not pattern.search(x):
            raise SchemaError(f"{path}: {_short(x)} does not match {schema['pattern']}")

    return check_string


def _number(schema: dict[str, Any]) -> Check:
    lo, hi = schema.get("minimum"), schema.get("maximum")

    def check_number(x: Any, path: str) -> None:
        if not _is(x, "number"):
            return
        if lo is not None and x < lo:
            raise SchemaError(f"{path}: {x} is less than {lo}")
        if hi is not None and x > hi:
            raise SchemaError(f"{path}: {x} is more than {hi}")

    return check_number


def _array(schema: dict[str, Any], root: dict[str, Any], cache: dict[str, Check]) -> Check:
    most, least = schema.get("maxItems"), schema.get("minItems")
    item = compile_schema(schema["items"], root, cache) if "items" in schema else None

    def check_array(x: Any, path: str) -> None:
        if not isinstance(x, list):
            return
        if most is not None and len(x) > most:
            raise SchemaError(f"{path}: more than {most} items")
        if least is not None and len(x) < least:
            raise SchemaError(f"{path}: fewer than {least} items")
        if item is not None:
            for i, value in enumerate(x):
                item(value, f"{path}[{i}]")

    return check_array


def _object(schema: dict[str, Any], root: dict[str, Any], cache: dict[str, Check]) -> Check:
    required = tuple(schema.get("required", ()))
    props = {k: compile_schema(v, root, cache) for k, v in schema.get("properties", {}).items()}
    extra = schema.get("additionalProperties", True)
    extra_check = compile_schema(extra, root, cache) if isinstance(extra, dict) else None
    names = compile_schema(schema["propertyNames"], root, cache) if "propertyNames" in schema else None

    def check_object(x: Any, path: str) -> None:
        if not isinstance(x, dict):
            return
        for key in required:
            if key not in x:
                raise SchemaError(f"{path}: missing required key {key!r}")
        for key, value in x.items():
            if names is not None:
                names(key, f"{path} key {key!r}")
            if key in props:
                props[key](value, f"{path}.{key}")
            elif extra is False:
                raise SchemaError(f"{path}: unexpected key {_short(key)}")
            elif extra_check is not None:
                extra_check(value, f"{path}.{key}")

    return check_object


def _ecma(pattern: str) -> str:
    """A pattern as JSON Schema means it (ECMA-262): a final ``$`` matches at the very end only,
    where Python's also matches before a final newline ("a.safetensors\\n" would pass)."""
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        return pattern[:-1] + r"\Z"
    return pattern


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."
