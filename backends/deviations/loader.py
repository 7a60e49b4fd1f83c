"""Reading a TOML file of deviations into `Deviation` records (`load`), validated by the rules of
``schema.json``: the built-in catalogue, the atlas' and a plugin's own all go through here.

The file's fields are checked against the schema's (unknown, missing, wrong type, not one of
the allowed values), each entry must be checked one way (a probe's ``case`` and ``shows``, or an
atlas ``question`` and ``answer``), ``case`` and ``shows`` are resolved to functions, and a
``reproducer`` path is read from beside the file. Every error names the file, the entry and
the field. tests/test_deviations.py also validates every file with jsonschema itself, so that
the schema and these checks cannot drift apart.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from attnspec.backends.deviation_probe import Deviation

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["CASES_MODULE", "SCHEMA", "load", "resolve"]

#: the JSON schema of a deviations file
SCHEMA = Path(__file__).with_name("schema.json")
#: where a bare ``case`` or ``shows`` name is looked up
CASES_MODULE = "attnspec.backends.deviation_cases"

# the file's name for a field -> the record's, where they differ (the record keeps the Python
# name plugins have written since before the file format)
_RENAMED = {"id": "deviation_id"}


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(SCHEMA.read_text(encoding="utf-8"))
    return schema


def _rule(rule: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """``rule`` with its ``$ref`` (one level, within the schema) merged in."""
    if "$ref" not in rule:
        return rule
    target = schema
    for part in rule["$ref"].removeprefix("#/").split("/"):
        target = target[part]
    return {**target, **{k: v for k, v in rule.items() if k != "$ref"}}


def _check_value(where: str, key: str, value: Any, rule: dict[str, Any], schema: dict[str, Any]) -> None:
    rule = _rule(rule, schema)
    if "enum" in rule and value not in rule["enum"]:
        raise ValueError(f"{where}: {key} must be one of {rule['enum']}, got {value!r}")
    kind = rule.get("type")
    if kind == "string":
        if not isinstance(value, str):
            raise ValueError(f"{where}: {key} must be a string, got {value!r}")
        if len(value) < rule.get("minLength", 0):
            raise ValueError(f"{where}: {key} is empty")
        if "pattern" in rule and not re.search(rule["pattern"], value):
            raise ValueError(
                f"{where}: {key} = {value!r} is not of the form the schema asks ({rule['pattern']})"
            )
    elif kind == "array":
        if not isinstance(value, list):
            raise ValueError(f"{where}: {key} must be a list, got {value!r}")
        for item in value:
            _check_value(where, f"{key} item", item, rule.get("items", {}), schema)
        if rule.get("uniqueItems") and len(set(value)) != len(value):
            raise ValueError(f"{where}: {key} repeats an item: {value!r}")


def _check_kind(where: str, raw: dict[str, Any], alternatives: list[dict[str, Any]]) -> None:
    """Exactly one of the schema's ``oneOf`` (a probe, an atlas question) fits the entry."""
    fits, needs = [], []
    for alt in alternatives:
        missing = [k for k in alt["required"] if k not in raw]
        barred = [k for k in (r["required"][0] for r in alt["not"]["anyOf"]) if k in raw]
        if not missing and not barred:
            fits.append(alt)
        needs.append(" and ".join(alt["required"]) + (f" (without {', '.join(barred)})" if barred else ""))
    if len(fits) != 1:
        raise ValueError(
            f"{where}: an entry is checked by a probe or by an atlas question, so it needs "
            f"{' or '.join(needs)}"
        )


def resolve(name: str, where: str = "", field: str = "") -> Any:
    """The function ``name`` stands for: a bare name of `attnspec.backends.deviation_cases`, or
    ``"module:name"`` (``name`` may be dotted: a class attribute). An error names ``where``
    and ``field``."""
    module_name, _, attr = name.rpartition(":")
    module_name = module_name or CASES_MODULE
    label = f"{where}: {field} = {name!r}" if where else repr(name)
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{label}: cannot import {module_name}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"{label}: {module_name} has no function {attr!r}") from None
    if not callable(obj):
        raise ValueError(f"{label}: {module_name}.{attr} is not a function")
    return obj


def _package_of(path: Path) -> str:
    """The dotted package a file sits in (its folders with an ``__init__.py``), or ""."""
    parts: list[str] = []
    folder = path.parent
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    return ".".join(parts)


def load(path: str | os.PathLike[str], *, source: str | None = None) -> tuple[Deviation, ...]:
    """The deviations of a TOML file (``[[deviation]]`` tables, see ``schema.json``), validated,
    as `Deviation` records. ``source`` is where a report says they are declared; by default the
    package the file is in and its name, e.g. ``"my_plugin (deviations.toml)"``."""
    path = Path(path)
    schema = _schema()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from exc
    extra = sorted(set(data) - set(schema["properties"]))
    if extra or not isinstance(data.get("deviation"), list):
        raise ValueError(f"{path}: a deviations file holds [[deviation]] tables only, got {sorted(data)}")
    if source is None:
        package = _package_of(path)
        source = f"{package} ({path.name})" if package else str(path)
    spec = schema["$defs"]["deviation"]
    found: list[Deviation] = []
    for i, raw in enumerate(data["deviation"]):
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: deviation #{i + 1} is not a table: {raw!r}")
        where = f"{path}: deviation {raw.get('id', f'#{i + 1}')!r}"
        unknown = sorted(set(raw) - set(spec["properties"]))
        if unknown:
            raise ValueError(
                f"{where}: unknown field {', '.join(unknown)} (the fields are "
                f"{', '.join(spec['properties'])})"
            )
        missing = [k for k in spec["required"] if k not in raw]
        if missing:
            raise ValueError(f"{where}: missing field {', '.join(missing)}")
        for key, value in raw.items():
            _check_value(where, key, value, spec["properties"][key], schema)
        _check_kind(where, raw, spec["oneOf"])
        fields: dict[str, Any] = {_RENAMED.get(str(k), str(k)): v for k, v in raw.items()}
        fields["tags"] = frozenset(raw.get("tags", ()))
        for key in ("case", "shows"):
            if key in raw:
                fields[key] = resolve(raw[key], where, key)
        if "reproducer" in raw:  # the script's text, as reports show it, and where it is
            file = path.parent / raw["reproducer"]
            try:
                fields["reproducer"] = file.read_text(encoding="utf-8")
            except OSError as exc:
                raise ValueError(
                    f"{where}: reproducer = {raw['reproducer']!r}: cannot read {file}: {exc}"
                ) from exc
            fields["reproducer_file"] = str(file)
        if any(d.deviation_id == raw["id"] for d in found):
            raise ValueError(f"{where}: the id is declared twice in this file")
        found.append(Deviation(**fields, source=source))
    return tuple(found)
