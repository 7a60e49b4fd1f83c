"""Declared deviations, checked both ways: each still shows on its native backend (else it is
stale), its reproducer script still runs, and no conformant backend shows it. And the data: every
deviations file (built-in, atlas, the example plugin's) follows the schema, and the loader refuses
a bad entry naming it."""

from __future__ import annotations

import functools
import importlib.util
import json
import runpy
import sys
import warnings
from pathlib import Path

import pytest

import attnspec.backends as registry
from attnspec.backends.compare import compare
from attnspec.backends.deviations import BUILTIN_SOURCE, DEVIATIONS, SCHEMA, Deviation, load, run, status

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

INSTALLED = {n for n, a in registry.available().items() if a.installed and n not in registry.atlas_names()}
CONFORMANT = [n for n in registry._BUILTINS if n in INSTALLED and not n.endswith("-native")]
BACKENDS_DIR = Path(registry.__file__).parent
ids = [d.deviation_id for d in DEVIATIONS]


@functools.cache
def backend(name):
    return registry.get(name)


def _needs(name):
    if name not in INSTALLED:
        pytest.skip(f"{name} is not installed here")


def test_ids_are_unique_and_entries_complete():
    assert len(set(ids)) == len(ids)
    for d in DEVIATIONS:
        assert d.backend in registry._BUILTINS and d.backend.endswith("-native"), d.deviation_id
        assert all([d.feature, d.spec_says, d.native_does, d.reproducer, d.fixed_by]), d.deviation_id
        assert d.deviation_id.startswith(d.backend.removesuffix("-native") + ".")


@pytest.mark.parametrize("dev", DEVIATIONS, ids=ids)
def test_still_reproduces_on_its_native_backend(dev):
    _needs(dev.backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = status(dev, backend(dev.backend))
    assert got == "observed", (
        f"stale deviation {dev.deviation_id}: {dev.backend} no longer does "
        f"'{dev.native_does}'; remove the entry, or update it"
    )


@pytest.mark.parametrize("dev", DEVIATIONS, ids=ids)
def test_reproducer_runs_and_its_assert_holds(dev):
    _needs(dev.backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runpy.run_path(dev.reproducer_file, run_name="__main__")  # the script file, as ruff lints it


@pytest.mark.parametrize("name", CONFORMANT)
@pytest.mark.parametrize("dev", DEVIATIONS, ids=ids)
def test_no_conformant_backend_shows_it(dev, name):
    be = backend(name)
    q, k, v, options = case = dev.case()
    if reasons := be.supports("sdpa", dtype=q.dtype.name):
        pytest.skip("; ".join(reasons))
    assert not dev.probe(be)
    if dev.function == "mha":
        _assert_mha_matches_golden(be, case)
        return
    result = run(be, case)
    assert not isinstance(result, Exception), f"{name}: {result!r}"
    assert compare(result, q, k, v, **options) == []  # out, and lse when asked (return_lse)


@pytest.mark.parametrize("dev", DEVIATIONS, ids=ids)
def test_the_fix_up_names_the_deviation(dev):
    adapter = dev.fixed_by.split(":")[0]
    lines = (BACKENDS_DIR / f"{adapter}.py").read_text().splitlines()
    comments = [line.split("#", 1)[1] for line in lines if "#" in line]
    assert any(dev.deviation_id in c for c in comments), (
        f"no comment in backends/{adapter}.py names {dev.deviation_id} at its fix-up"
    )


def _assert_mha_matches_golden(be, case):
    from attnspec.backends.deviations import run_mha
    from attnspec.spec.tolerance import compare as within
    from attnspec.spec.tolerance_mha import mha_golden

    query, key, value, options = case
    result = run_mha(be, case)
    assert not isinstance(result, Exception), f"{be.name}: {result!r}"
    out, weights = result if isinstance(result, tuple) else (result, None)
    g = mha_golden(query, key, value, **{k: v for k, v in options.items() if k != "return_weights"})
    assert within(out, g.out, g.allowed_out).ok
    if weights is not None:
        assert within(weights, g.weights, g.allowed_w).ok


# -- the data: one format, one schema, one loader (issue #29) ------------------------------------


def _data_files():
    files = [
        *sorted((BACKENDS_DIR / "deviations").glob("*.toml")),
        BACKENDS_DIR / "atlas" / "deviations.toml",
    ]
    plugin = importlib.util.find_spec("attnspec_example_plugin")
    if plugin is not None and plugin.origin:
        files.append(Path(plugin.origin).parent / "deviations.toml")
    return files


@pytest.mark.parametrize("path", _data_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_deviations_file_follows_the_schema_and_loads(path):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(tomllib.loads(path.read_text()), schema, cls=jsonschema.Draft202012Validator)
    assert load(path)  # and the loader agrees


def test_every_reproducer_file_is_an_entrys_and_read_as_it_is():
    folder = BACKENDS_DIR / "deviations" / "reproducers"
    assert {Path(d.reproducer_file) for d in DEVIATIONS} == set(folder.glob("*.py"))
    for d in DEVIATIONS:
        assert Path(d.reproducer_file).read_text() == d.reproducer, d.deviation_id
        assert d.source == BUILTIN_SOURCE and d.check == "probe"


def test_the_checker_reads_an_atlas_entry_against_the_answers():
    from attnspec.backends.atlas.deviations import ATLAS_DEVIATIONS

    d = ATLAS_DEVIATIONS[0]
    assert d.check == "atlas" and isinstance(d, Deviation)
    assert status(d, {d.question: d.answer}) == "observed"
    assert status(d, [{"id": d.question, "answer": "something else"}]) == "stale"
    assert status(d, {d.question: "n/a: cannot be asked"}) == status(d, {}) == "not_exercised"
    with pytest.raises(TypeError, match="not by a probe"):
        d.probe(backend("numpy"))


GOOD = """\
[[deviation]]
id = "torch.example"
backend = "torch-native"
tags = ["no_visible_row"]
feature = "sdpa: a row with no visible key"
spec_says = "output 0"
native_does = "NaN"
fixed_by = "torch: nothing"
case = "empty_row_by_mask"
shows = "row1_is_nan"
reproducer = "repro.py"
"""

# what the loader refuses, with the error that names the entry and the field; and whether the
# schema refuses it too (a name that does not resolve, a file that is not there: only the loader)
BAD = {
    "unknown case": (
        GOOD.replace('"empty_row_by_mask"', '"no_such_case"'),
        r"deviation 'torch\.example': case = 'no_such_case': .*deviation_cases has no function",
        False,
    ),
    "shows not importable": (
        GOOD.replace('"row1_is_nan"', '"no_such_module:f"'),
        r"deviation 'torch\.example': shows = 'no_such_module:f': cannot import",
        False,
    ),
    "probe and atlas": (
        GOOD + 'question = "empty_row_mask"\nanswer = "NaN"\n',
        r"'torch\.example': an entry is checked by a probe or by an atlas question",
        True,
    ),
    "neither": (
        "\n".join(line for line in GOOD.splitlines() if not line.startswith(("case", "shows"))),
        r"'torch\.example': an entry is checked by a probe or by an atlas question",
        True,
    ),
    "unknown field": (GOOD + 'colour = "red"\n', r"'torch\.example': unknown field colour", True),
    "bad function": (GOOD + 'function = "lsh"\n', r"'torch\.example': function must be one of", True),
    "tags not a list": (GOOD.replace('["no_visible_row"]', '"no_visible_row"'), r"tags must be a list", True),
    "no reproducer file": (
        GOOD.replace('"repro.py"', '"gone.py"'),
        r"reproducer = 'gone\.py': cannot read",
        False,
    ),
    "id twice": (GOOD + "\n" + GOOD, r"'torch\.example': the id is declared twice", False),
}


def test_a_good_entry_loads(tmp_path):
    (tmp_path / "repro.py").write_text("assert True\n")
    (tmp_path / "good.toml").write_text(GOOD)
    (dev,) = load(tmp_path / "good.toml")
    assert dev.case.__name__ == "empty_row_by_mask" and dev.reproducer == "assert True\n"
    assert dev.source == str(tmp_path / "good.toml")  # not in a package: the file itself


@pytest.mark.parametrize("name", BAD)
def test_the_loader_refuses_a_bad_entry_naming_it(name, tmp_path):
    text, error, schema_refuses = BAD[name]
    (tmp_path / "repro.py").write_text("assert True\n")
    (tmp_path / "bad.toml").write_text(text)
    with pytest.raises(ValueError, match=error):
        load(tmp_path / "bad.toml")
    jsonschema = pytest.importorskip("jsonschema")
    valid = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text())).is_valid(tomllib.loads(text))
    assert valid is not schema_refuses
