"""Conformance vectors (#26): the manifest and its schema, reproducible bundles, and a verify that
says what is wrong with a bundle in one line (exit 2) and with an output as a failed case (exit 1).

The bundles are the ``dev`` profile's sdpa cases (126 per dtype, under a second to write); the
command line runs as a subprocess (the ``attnspec`` script beside ``sys.executable``), so exit
status, stderr and the absence of a traceback are what a user sees.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

from attnspec.conformance import tensorfile
from attnspec.conformance import vectors as V
from attnspec.conformance.jsonschema_lite import SchemaError
from attnspec.conformance.jsonschema_lite import validate as lite_validate
from attnspec.spec.dtypes import FLOAT_DTYPES

ATTNSPEC = Path(sys.executable).with_name("attnspec")
SCHEMA = json.loads(V.SCHEMA_FILE.read_text())
#: the address space a verify of hostile outputs runs in: any allocation of a declared size fails
LIMIT_AS = 2 * 2**30


def cli(*args: str | os.PathLike, limit_as: int | None = None, **env: str) -> subprocess.CompletedProcess:
    def limit() -> None:
        if limit_as:
            import resource  # POSIX only, and only where a limit is asked for

            resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))

    cmd = [
        str(ATTNSPEC) if ATTNSPEC.exists() else sys.executable,
        *([] if ATTNSPEC.exists() else ["-m", "attnspec"]),
    ]
    return subprocess.run(
        [*cmd, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
        preexec_fn=limit,
    )


def one_line(p: subprocess.CompletedProcess) -> str:
    """The single line a usage error prints on stderr (exit 2, no traceback)."""
    assert "Traceback" not in p.stderr, p.stderr
    lines = p.stderr.splitlines()
    assert p.returncode == 2, f"exit {p.returncode}: {p.stderr[-2000:]}"
    assert len(lines) == 1, f"{len(lines)} lines on stderr: {p.stderr[-2000:]}"
    assert lines[0].startswith("attnspec vectors: "), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("vectors")
    V.export(out, "dev", ["sdpa"], FLOAT_DTYPES)
    return out


@pytest.fixture(scope="module")
def bundle(export_dir) -> Path:
    return export_dir / "sdpa-float32"


@pytest.fixture(scope="module")
def manifest(bundle) -> dict[str, Any]:
    return json.loads((bundle / "manifest.json").read_text())


@pytest.fixture(scope="module")
def numpy_outputs(export_dir, tmp_path_factory) -> Path:
    """The numpy backend's outputs for every dev bundle, written by ``attnspec vectors run``."""
    out = tmp_path_factory.mktemp("numpy-outputs")
    p = cli("vectors", "run", "numpy", export_dir, "--out", out)
    assert p.returncode == 0, p.stderr
    total = sum(len(b.cases) for b in V.load(export_dir))
    assert f"{total} outputs, 0 unsupported, 0 errors" in p.stdout
    return out


# -- the schema and the manifest -------------------------------------------------------------


def test_shipped_schema_is_valid_json_schema_2020_12(bundle):
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["properties"]["format"] == {"const": V.FORMAT}
    # each bundle carries the schema it follows, byte for byte the one in the package
    assert (bundle / "manifest.schema.json").read_bytes() == V.SCHEMA_FILE.read_bytes()


def _manifests(export_dir: Path, tmp_path: Path) -> list[dict[str, Any]]:
    V.export(tmp_path, "default", ["sdpa"], ["float32"])
    paths = sorted(export_dir.glob("*/manifest.json")) + [tmp_path / "sdpa-float32" / "manifest.json"]
    assert len(paths) == 5
    return [json.loads(p.read_text()) for p in paths]


def test_every_exported_manifest_validates_with_jsonschema_and_the_lite_validator(export_dir, tmp_path):
    validator = jsonschema.Draft202012Validator(SCHEMA)
    for m in _manifests(export_dir, tmp_path):
        where = f"{m['profile']} {m['dtype']}"
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(m)]
        assert not errors, f"{where}: {errors[:5]}"
        lite_validate(m, SCHEMA)  # raises SchemaError if it disagrees
        assert m["content_sha256"] == V.content_hash(m), where
        features = {e["feature"] for e in m["cases"]}  # the profile's cases for every feature
        assert features >= set(V.families()["sdpa"].features), where
        assert len(m["cases"]) >= V.PROFILE_CASES[m["profile"]] * len(V.families()["sdpa"].features), where
    index = json.loads((export_dir / "index.json").read_text())
    assert [b["path"] for b in index["bundles"]] == [f"sdpa-{d}" for d in FLOAT_DTYPES]
    for b in index["bundles"]:
        m = json.loads((export_dir / b["path"] / "manifest.json").read_text())
        assert b["content_sha256"] == m["content_sha256"] and b["cases"] == len(m["cases"])


def _case(m: dict, **change: Any) -> dict:
    m["cases"][0].update(change)
    return m


def _output(m: dict, **change: Any) -> dict:
    m["cases"][0]["outputs"]["out"].update(change)
    return m


def _without(key: str) -> Callable[[dict], dict]:
    def drop(m: dict) -> dict:
        del m[key]
        return m

    return drop


def _without_case_key(key: str) -> Callable[[dict], dict]:
    def drop(m: dict) -> dict:
        del m["cases"][0][key]
        return m

    return drop


BROKEN: dict[str, Callable[[dict], dict]] = {
    **{f"no {k}": _without(k) for k in SCHEMA["required"]},
    **{f"case without {k}": _without_case_key(k) for k in SCHEMA["$defs"]["case"]["required"]},
    "an extra top-level key": lambda m: {**m, "date": "2026-01-01"},
    "another format": lambda m: {**m, "format": "attnspec.vectors/2"},
    "spec_version not semantic": lambda m: {**m, "spec_version": "1.0"},
    "an unknown dtype": lambda m: {**m, "dtype": "int8"},
    "max_side a string": lambda m: {**m, "max_side": "64"},
    "max_side a boolean": lambda m: {**m, "max_side": True},
    "max_side 0": lambda m: {**m, "max_side": 0},
    "a clause id with a space": lambda m: {**m, "clauses": {"sdpa empty": "x"}},
    "content_sha256 in capitals": lambda m: {**m, "content_sha256": m["content_sha256"].upper()},
    "content_sha256 short": lambda m: {**m, "content_sha256": "ab" * 31},
    "cases an object": lambda m: {**m, "cases": {}},
    "a case a list": lambda m: {**m, "cases": [[]]},
    "a case with an extra key": lambda m: _case(m, path="x"),
    "a file name with ../": lambda m: _case(m, file="../sdpa-float32-0000-plain.safetensors"),
    "a file name with a folder": lambda m: _case(m, file="sub/sdpa-float32-0000-plain.safetensors"),
    "an absolute file name": lambda m: _case(m, file="/etc/passwd.safetensors"),
    "a file name starting with a dot": lambda m: _case(m, file="..safetensors"),
    "a file that is not safetensors": lambda m: _case(m, file="case.pkl"),
    "an id with a slash": lambda m: _case(m, id="a/b"),
    "an empty id": lambda m: _case(m, id=""),
    "bytes below the header size": lambda m: _case(m, bytes=7),
    "bytes a float": lambda m: _case(m, bytes=1000.5),
    "sha256 not hex": lambda m: _case(m, sha256="z" * 64),
    "a feature in capitals": lambda m: _case(m, feature="Plain"),
    "tags not strings": lambda m: _case(m, tags=[1]),
    "65 clauses": lambda m: _case(m, clauses=["sdpa.output"] * 65),
    "an option that is an object": lambda m: _case(m, options={"window": {"left": 1}}),
    "an option that is a list of floats": lambda m: _case(m, options={"window": [0.5, 1]}),
    "an option named with a dash": lambda m: _case(m, options={"return-weights": True}),
    "an input of complex dtype": lambda m: _case(m, inputs={"q": {"dtype": "complex64", "shape": [1]}}),
    "an input of rank 9": lambda m: _case(m, inputs={"q": {"dtype": "float32", "shape": [1] * 9}}),
    "a negative dim": lambda m: _case(m, inputs={"q": {"dtype": "float32", "shape": [-1]}}),
    "an input without shape": lambda m: _case(m, inputs={"q": {"dtype": "float32"}}),
    "an output in int64": lambda m: _output(m, dtype="int64"),
    "a negative allowed error": lambda m: _output(m, allowed=-1e-3),
    "allowed a string": lambda m: _output(m, allowed="0.001"),
    "zero_rows negative": lambda m: _output(m, zero_rows=-1),
    "an output with an extra key": lambda m: _output(m, rtol=0.1),
}


@pytest.mark.parametrize("what", list(BROKEN))
def test_jsonschema_lite_agrees_with_jsonschema_on_a_broken_manifest(manifest, what):
    m = BROKEN[what](copy.deepcopy(manifest))
    assert list(jsonschema.Draft202012Validator(SCHEMA).iter_errors(m)), f"jsonschema accepts: {what}"
    with pytest.raises(SchemaError) as info:
        lite_validate(m, SCHEMA)
    assert "\n" not in str(info.value)


# -- the same selection gives the same bytes -------------------------------------------------


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_export_twice_gives_byte_identical_bundles(export_dir, tmp_path):
    # two processes with different string hashing: nothing may depend on set or dict order
    for seed, folder in (("0", "a"), ("12345", "b")):
        p = cli("vectors", "export", "--out", tmp_path / folder, "--function", "sdpa", PYTHONHASHSEED=seed)
        assert p.returncode == 0, p.stderr
    a, b = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert sorted(a) == sorted(b)
    cases = sum(len(b.cases) for b in V.load(export_dir))
    assert len(a) == 1 + 4 * 2 + cases  # index.json; per bundle: manifest, schema, cases
    assert [n for n in a if a[n] != b[n]] == []
    assert _files(export_dir) == a  # and the same as this process's export


# -- a bundle that cannot be used: one line, exit 2 ------------------------------------------


def _rehash(m: dict) -> dict:
    m["content_sha256"] = V.content_hash(m)
    return m


def _edit_manifest(change: Callable[[dict], dict], rehash: bool = True) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        path = folder / "manifest.json"
        m = change(json.loads(path.read_text()))
        path.write_text(json.dumps(_rehash(m) if rehash else m, indent=1))

    return edit


def _flip_byte(folder: Path) -> None:
    path = folder / "sdpa-float32-0003-plain.safetensors"
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01
    path.write_bytes(bytes(data))


def _case_entry_value(m: dict, key: str, value: Any) -> dict:
    m["cases"][3][key] = value
    return m


BUNDLE_ERRORS: dict[str, tuple[Callable[[Path], None], str]] = {
    "an edited manifest": (
        _edit_manifest(lambda m: _output(m, allowed=1.0), rehash=False),
        "content hash mismatch: the manifest was altered after export",
    ),
    "a case file with a flipped byte": (_flip_byte, "SHA-256 does not match the manifest"),
    "a truncated case file": (
        lambda f: (f / "sdpa-float32-0003-plain.safetensors").write_bytes(b"\0" * 16),
        "bytes, the manifest says",
    ),
    "a missing case file": (
        lambda f: (f / "sdpa-float32-0003-plain.safetensors").unlink(),
        "sdpa-float32-0003-plain.safetensors: listed in the manifest but missing",
    ),
    "a manifest missing a key": (
        _edit_manifest(lambda m: {k: v for k, v in m.items() if k != "profile"}),
        "does not match the bundle schema: $: missing required key 'profile'",
    ),
    "a manifest with a wrong type": (
        _edit_manifest(lambda m: {**m, "max_side": "64"}),
        "does not match the bundle schema: $.max_side: expected integer, got str",
    ),
    "a case with a wrong type": (
        _edit_manifest(lambda m: _case_entry_value(m, "bytes", "1000")),
        "does not match the bundle schema: $.cases[3].bytes: expected integer",
    ),
    "a file name containing ../": (
        _edit_manifest(
            lambda m: _case_entry_value(m, "file", "../sdpa-float16/sdpa-float16-0003-plain.safetensors")
        ),
        "does not match the bundle schema: $.cases[3].file",
    ),
    "another format": (
        _edit_manifest(lambda m: {**m, "format": "attnspec.vectors/9"}),
        "format 'attnspec.vectors/9'; this attnspec reads attnspec.vectors/1",
    ),
    "a function this attnspec does not judge": (
        _edit_manifest(lambda m: {**m, "function": "flash_decoding"}),
        "function 'flash_decoding' is not one this attnspec judges",
    ),
    "a case id twice": (
        _edit_manifest(lambda m: _case_entry_value(m, "id", m["cases"][2]["id"])),
        "appears twice",
    ),
    "a manifest that is not JSON": (
        lambda f: (f / "manifest.json").write_bytes(b'{"format": '),
        "manifest.json: not valid JSON",
    ),
    "a manifest with NaN": (
        lambda f: (f / "manifest.json").write_bytes(b'{"format": NaN}'),
        "manifest.json: not valid JSON (NaN is not JSON",
    ),
    "a manifest that is a list": (
        lambda f: (f / "manifest.json").write_bytes(b"[]"),
        "does not match the bundle schema: $: expected object, got list",
    ),
    "no manifest": (lambda f: (f / "manifest.json").unlink(), "no manifest.json (a bundle) or index.json"),
    "a missing folder": (lambda f: shutil.rmtree(f), "no manifest.json (a bundle) or index.json"),
}


@pytest.mark.parametrize("what", list(BUNDLE_ERRORS))
def test_verify_of_an_unusable_bundle_says_so_in_one_line_and_exits_2(bundle, numpy_outputs, tmp_path, what):
    change, expect = BUNDLE_ERRORS[what]
    folder = tmp_path / "sdpa-float32"
    shutil.copytree(bundle, folder)
    change(folder)
    line = one_line(cli("vectors", "verify", folder, numpy_outputs, "--name", "x", "--out", tmp_path / "r"))
    assert expect in line, line


def test_an_index_with_a_path_out_of_its_folder_or_another_hash_exits_2(export_dir, numpy_outputs, tmp_path):
    root = tmp_path / "export"
    shutil.copytree(export_dir, root)
    index = json.loads((root / "index.json").read_text())
    for path, expect in (
        ("../export/sdpa-float32", "is not a plain folder name"),
        (".", "not a plain folder name"),
    ):
        (root / "index.json").write_text(
            json.dumps({**index, "bundles": [{**index["bundles"][0], "path": path}]})
        )
        line = one_line(cli("vectors", "verify", root, numpy_outputs, "--name", "x", "--out", tmp_path / "r"))
        assert expect in line, line
    other = {**index["bundles"][0], "content_sha256": "0" * 64}
    (root / "index.json").write_text(json.dumps({**index, "bundles": [other]}))
    line = one_line(cli("vectors", "verify", root, numpy_outputs, "--name", "x", "--out", tmp_path / "r"))
    assert "does not match the index's 000000000000..." in line, line


def test_a_missing_outputs_folder_exits_2(bundle, tmp_path):
    line = one_line(
        cli("vectors", "verify", bundle, tmp_path / "absent", "--name", "x", "--out", tmp_path / "r")
    )
    assert "the outputs folder does not exist" in line, line


def test_a_file_name_ending_in_a_newline_is_a_schema_error(bundle, numpy_outputs, tmp_path):
    folder = tmp_path / "sdpa-float32"
    shutil.copytree(bundle, folder)
    _edit_manifest(lambda m: _case_entry_value(m, "file", m["cases"][3]["file"] + "\n"))(folder)
    line = one_line(cli("vectors", "verify", folder, numpy_outputs, "--name", "x", "--out", tmp_path / "r"))
    assert "does not match the bundle schema" in line, line


# -- the numpy backend conforms exactly ------------------------------------------------------


def test_numpy_outputs_conform(export_dir, numpy_outputs, tmp_path):
    p = cli("vectors", "verify", export_dir, numpy_outputs, "--name", "numpy", "--out", tmp_path / "r")
    assert p.returncode == 0, p.stderr[-3000:]
    bundles = V.load(export_dir)
    total = sum(len(b.cases) for b in bundles)
    assert f"CONFORMS: {total} cases: {total} passed, 0 failed" in p.stderr
    results = json.loads((tmp_path / "r" / "results" / "conformance-numpy-vectors.json").read_text())
    assert [(b["bundle"], b["passed"]) for b in results["vectors"]["bundles"]] == [
        (f"sdpa-{d}", len(b.cases)) for d, b in zip(FLOAT_DTYPES, bundles)
    ]


def test_numpy_outputs_equal_the_rounded_goldens_bit_for_bit(export_dir, numpy_outputs):
    compared = 0
    for b in V.load(export_dir):
        for entry in b.cases:
            case, _ = tensorfile.read(b.path / entry["file"])
            got, _ = tensorfile.read(numpy_outputs / f"{entry['id']}.safetensors")
            assert sorted(got) == sorted(entry["outputs"]), entry["id"]
            for name in entry["outputs"]:
                want, a = case[f"expected.{name}.rounded"], got[name]
                where = f"{entry['id']} {name}"
                assert (a.dtype, a.shape) == (want.dtype, want.shape), where
                nan = np.isnan(want.astype(np.float64))
                assert np.array_equal(np.isnan(a.astype(np.float64)), nan), f"{where}: NaN positions differ"
                bits = f"u{want.dtype.itemsize}"
                assert np.array_equal(a.view(bits)[~nan], want.view(bits)[~nan]), f"{where}: bits differ"
                compared += 1
    assert compared > 4 * 100


# -- outputs that are malformed: failed cases, never a crash ---------------------------------


def _raw(header: object, data: bytes = b"", length: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def _good(outputs: Path, case_id: str) -> dict[str, np.ndarray]:
    return tensorfile.read(outputs / f"{case_id}.safetensors")[0]


#: name -> (needs a case with weights, make(good tensors, good bytes) -> bytes, or None for a folder;
#: what the message's first line says)
MALFORMED_OUTPUTS: dict[str, tuple[bool, Callable[[dict, bytes], bytes | None], str]] = {
    "truncated": (False, lambda t, b: b[:-10], "output file malformed"),
    "a wrong shape": (False, lambda t, b: tensorfile.write_bytes({"out": t["out"][..., :-1]}), "out.shape="),
    "a wrong dtype": (
        False,
        lambda t, b: tensorfile.write_bytes({"out": t["out"].astype(np.float64)}),
        "out.dtype=float64, but should be float32",
    ),
    "a missing tensor (weights asked for)": (
        True,
        lambda t, b: tensorfile.write_bytes({"out": t["out"]}),
        "returned no weights, but option return_weights=true asks for it",
    ),
    "garbage bytes": (False, lambda t, b: np.random.default_rng(0).bytes(4096), "output file malformed"),
    "a zero-length file": (False, lambda t, b: b"", "too short for a safetensors header"),
    "a huge shape": (
        False,
        lambda t, b: _raw(
            {"out": {"dtype": "F32", "shape": [2**40], "data_offsets": [0, 2**42]}}, b"\0" * 64
        ),
        "must be a list of at most 8 non-negative integers",
    ),
    "a huge shape with consistent offsets": (
        False,
        lambda t, b: _raw(
            {"out": {"dtype": "F32", "shape": [2**38], "data_offsets": [0, 2**40]}}, b"\0" * 64
        ),
        "the header declares 1099511627776 bytes of tensor data, the file holds 64",
    ),
    "a huge header length": (False, lambda t, b: _raw({}, b"\0" * 64, length=2**63), "header length"),
    "offsets past the end": (
        False,
        lambda t, b: _raw(
            {
                "out": {
                    "dtype": "F32",
                    "shape": [t["out"].size + 4],
                    "data_offsets": [0, 4 * t["out"].size + 16],
                }
            },
            t["out"].tobytes(),
        ),
        "bytes of tensor data, the file holds",
    ),
    "overlapping offsets": (
        True,
        lambda t, b: _raw(
            {
                "out": {"dtype": "F32", "shape": list(t["out"].shape), "data_offsets": [0, t["out"].nbytes]},
                "weights": {
                    "dtype": "F32",
                    "shape": list(t["out"].shape),
                    "data_offsets": [0, t["out"].nbytes],
                },
            },
            t["out"].tobytes(),
        ),
        "without gaps or overlap",
    ),
    "a BOOL with byte 7": (
        False,
        lambda t, b: _raw(
            {
                "flag": {"dtype": "BOOL", "shape": [2], "data_offsets": [0, 2]},
                "out": {
                    "dtype": "F32",
                    "shape": list(t["out"].shape),
                    "data_offsets": [2, 2 + t["out"].nbytes],
                },
            },
            b"\x01\x07" + t["out"].tobytes(),
        ),
        "is BOOL but holds bytes other than 0 and 1",
    ),
    "JSON with NaN": (
        False,
        lambda t, b: _raw(b'{"__metadata__": {"x": NaN}}'),
        "the header is not valid UTF-8 JSON (NaN is not JSON)",
    ),
    "a header that is not UTF-8": (False, lambda t, b: _raw(b'{"\xff": 1}'), "not valid UTF-8 JSON"),
    "far more data than the outputs need": (
        False,
        lambda t, b: tensorfile.write_bytes({"out": t["out"], "pad": np.zeros(2**18, np.float64)}),
        "more than the limit of",
    ),
    "a folder, not a file": (False, lambda t, b: None, "output file unreadable"),
    "NaN where a value is expected": (
        False,
        lambda t, b: tensorfile.write_bytes({"out": np.full_like(t["out"], np.nan)}),
        "",
    ),
}


@pytest.fixture(scope="module")
def malformed_outputs(bundle, manifest, numpy_outputs, tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The float32 bundle's numpy outputs with one case per `MALFORMED_OUTPUTS` entry spoiled:
    (the outputs folder, case id -> what was done to it)."""
    out = tmp_path_factory.mktemp("malformed")
    for e in manifest["cases"]:
        shutil.copy(numpy_outputs / f"{e['id']}.safetensors", out)
    plain = [
        e["id"] for e in manifest["cases"] if set(e["outputs"]) == {"out"} and e["outputs"]["out"]["nan"] == 0
    ]
    weighted = [
        e["id"] for e in manifest["cases"] if "weights" in e["outputs"] and e["outputs"]["out"]["nan"] == 0
    ]
    spoiled = {}
    for what, (weights, make, _) in MALFORMED_OUTPUTS.items():
        case_id = (weighted if weights else plain).pop(0)
        path = out / f"{case_id}.safetensors"
        data = make(_good(out, case_id), path.read_bytes())
        if data is None:
            path.unlink()
            path.mkdir()
        else:
            _write(path, data)
        spoiled[case_id] = what
    return out, spoiled


def test_each_malformed_output_is_a_failed_case_with_a_one_line_cause(bundle, malformed_outputs):
    outputs, spoiled = malformed_outputs
    (b,) = V.load(bundle)
    fam = V.families()["sdpa"]
    statuses = {}
    for entry in b.cases:
        r = V.case_record(b.case(entry), fam, outputs, "x", bundle)
        statuses[entry["id"]] = r["status"]
        if entry["id"] in spoiled:
            what = spoiled[entry["id"]]
            assert r["status"] == "failed", what
            first = r["message"].splitlines()[0]
            assert first.startswith("[x] sdpa matches_golden: "), first
            assert MALFORMED_OUTPUTS[what][2] in first, f"{what}: {first}"
            assert str(outputs) not in first, first  # the file's name, not a long path
    assert {s for i, s in statuses.items() if i not in spoiled} == {"passed"}  # the others still judged


def test_verify_of_malformed_outputs_fails_them_without_a_crash_or_a_large_allocation(
    bundle, malformed_outputs, tmp_path
):
    outputs, spoiled = malformed_outputs
    n = len(V.load(bundle)[0].cases)
    p = cli("vectors", "verify", bundle, outputs, "--name", "x", "--out", tmp_path / "r", limit_as=LIMIT_AS)
    assert "Traceback" not in p.stderr and "MemoryError" not in p.stderr, p.stderr[-3000:]
    assert p.returncode == 1, p.stderr[-3000:]
    assert f"FAILS: {n} cases: {n - len(spoiled)} passed, {len(spoiled)} failed" in p.stderr, p.stderr[-3000:]
    results = json.loads((tmp_path / "r" / "results" / "conformance-x-vectors.json").read_text())
    (counts,) = results["vectors"]["bundles"]
    assert (counts["failed"], counts["passed"], counts["not_run"]) == (len(spoiled), n - len(spoiled), 0)


def test_an_output_whose_dtype_is_a_list_is_a_failed_case(bundle, manifest, numpy_outputs, tmp_path):
    for e in manifest["cases"][:3]:
        shutil.copy(numpy_outputs / f"{e['id']}.safetensors", tmp_path)
    entry = manifest["cases"][0]
    header = {"out": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}
    _write(tmp_path / f"{entry['id']}.safetensors", _raw(header, b"\0" * 4))
    (b,) = V.load(bundle)
    r = V.case_record(b.case(entry), V.families()["sdpa"], tmp_path, "x", bundle)
    assert r["status"] == "failed" and "output file malformed" in r["message"]


def test_an_error_file_is_a_failed_case_with_its_message(bundle, manifest, tmp_path):
    entry = manifest["cases"][0]
    (tmp_path / f"{entry['id']}.error").write_text("kernel launch failed: invalid argument\nsecond line\n")
    (b,) = V.load(bundle)
    r = V.case_record(b.case(entry), V.families()["sdpa"], tmp_path, "x", bundle)
    assert r["status"] == "failed"
    assert "raised kernel launch failed: invalid argument" in r["message"].splitlines()[0]


# -- unsupported, not run, incomplete --------------------------------------------------------


def test_unsupported_declarations_and_a_case_not_run_make_the_verdict_incomplete(
    bundle, manifest, numpy_outputs, tmp_path
):
    out = tmp_path / "outputs"
    out.mkdir()
    ids = [e["id"] for e in manifest["cases"]]
    for i in ids:
        shutil.copy(numpy_outputs / f"{i}.safetensors", out)
    declared = {
        ids[0]: (b"no bfloat16 on this device\n", "no bfloat16 on this device"),
        ids[5]: (b"", "declared unsupported (no reason given)"),
        ids[9]: (b"bad \xff\xfe bytes", "bad \ufffd\ufffd bytes"),
    }
    for i, (text, _) in declared.items():
        (out / f"{i}.safetensors").unlink()
        (out / f"{i}.unsupported").write_bytes(text)
    (out / f"{ids[20]}.safetensors").unlink()  # not run: no file at all

    (b,) = V.load(bundle)
    fam = V.families()["sdpa"]
    for i, (_, reason) in declared.items():
        r = V.case_record(b.case(b.cases[ids.index(i)]), fam, out, "x", bundle)
        assert (r["status"], r["reason"]) == ("unsupported", reason)
    assert V.case_record(b.case(b.cases[20]), fam, out, "x", bundle)["status"] == "not run"

    p = cli("vectors", "verify", bundle, out, "--name", "x", "--out", tmp_path / "r")
    assert "Traceback" not in p.stderr
    assert p.returncode == 1, p.stderr[-3000:]
    assert f"NOT RUN 1 case has no output and no .unsupported declaration: {ids[20]}" in p.stderr
    assert "\nINCOMPLETE: " in p.stderr, p.stderr[-3000:]
    results = json.loads((tmp_path / "r" / "results" / "conformance-x-vectors.json").read_text())
    (counts,) = results["vectors"]["bundles"]
    assert (counts["passed"], counts["unsupported"], counts["not_run"], counts["failed"]) == (
        len(ids) - 4,
        3,
        1,
        0,
    )
    reasons = {x for row in results["rows"] for x in row["unsupported_reasons"]}
    assert reasons == {reason for _, reason in declared.values()}


@pytest.mark.parametrize("kind", ["an empty folder", "only unsupported declarations"])
def test_no_output_at_all_is_incomplete(bundle, manifest, tmp_path, kind):
    out = tmp_path / "outputs"
    out.mkdir()
    if kind == "only unsupported declarations":
        for e in manifest["cases"]:
            (out / f"{e['id']}.unsupported").write_text("sdpa is not implemented\n")
    p = cli("vectors", "verify", bundle, out, "--name", "x", "--out", tmp_path / "r")
    assert "Traceback" not in p.stderr
    assert p.returncode == 1, p.stderr[-3000:]
    assert "attnspec vectors verify: no case ran to a verdict" in p.stderr
    assert "\nINCOMPLETE: " in p.stderr


# -- the benchmark (nox -s bench) ------------------------------------------------------------


def test_vectors_benchmark_figures_targets_and_rendering():
    from attnspec.bench import vectors as bench_vectors
    from attnspec.reports._io import Results
    from attnspec.reports.performance import vectors_throughput

    doc = bench_vectors.run_vectors(("dev",), repeats=1)
    (f,) = doc["figures"]
    assert f["cases"] == f["passed"] == f["outputs_written"] and f["failed"] == f["not_run"] == 0
    assert 0 < f["size_mb"] == f["size_bytes"] / 1e6 and f["export_s"] > 0
    assert f["verify_cases_per_s"] == pytest.approx(f["cases"] / f["verify_s"])
    assert [t["name"] for t in doc["targets"]] == [
        f"vectors dev: {what}" for _, _, _, what in bench_vectors.TARGETS.values()
    ]
    assert all(
        isinstance(t["met"], bool) and t["detail"].startswith(("met", "missed")) for t in doc["targets"]
    )
    slow = bench_vectors.targets([{**f, "verify_cases_per_s": 1000.0}])[2]
    assert slow["met"] is False and slow["detail"].startswith("missed by 1e+03 cases/s")
    bench = {"backend": "numpy", "device": "cpu", "_file": "bench-numpy-cpu-targets.json", "vectors": doc}
    lines = vectors_throughput(Results(Path("."), bench=[bench]))
    assert "## Conformance vectors" in lines
    assert any(line.startswith("| numpy ") and "| dev " in line for line in lines[-1].splitlines())


def _rewrite_case(folder: Path, change: Callable[[dict[str, np.ndarray]], None]) -> None:
    """Change case 0003's tensors and re-hash file and manifest: a consistent bundle whose file
    disagrees with what its manifest declares (what a hostile or buggy exporter could write)."""
    path = folder / "manifest.json"
    m = json.loads(path.read_text())
    entry = m["cases"][3]
    tensors, meta = tensorfile.read(folder / entry["file"])
    change(tensors)
    data = tensorfile.write(folder / entry["file"], tensors, meta)
    entry["sha256"], entry["bytes"] = hashlib.sha256(data).hexdigest(), len(data)
    path.write_text(json.dumps(_rehash(m), indent=1))


CONSISTENT_BUT_WRONG = {
    "a declared golden missing": (
        lambda t: t.pop("expected.out"),
        "'expected.out', listed in the manifest, is not",
    ),
    "an input of another shape": (lambda t: t.update(q=t["q"][..., :1]), "tensor 'q' is float32"),
    "zero rows of another shape": (
        lambda t: t.update({"zero_rows.out": np.ones(3, bool)}),
        "zero_rows.out is bool[3]",
    ),
}


@pytest.mark.parametrize("what", sorted(CONSISTENT_BUT_WRONG))
@pytest.mark.parametrize("command", ["verify", "run"])
def test_a_case_file_that_disagrees_with_its_manifest_exits_2(bundle, numpy_outputs, tmp_path, what, command):
    change, expect = CONSISTENT_BUT_WRONG[what]
    folder = tmp_path / "sdpa-float32"
    shutil.copytree(bundle, folder)
    _rewrite_case(folder, change)
    args = (
        ("verify", folder, numpy_outputs, "--name", "x", "--out", tmp_path / "r")
        if command == "verify"
        else ("run", "numpy", folder, "--out", tmp_path / "o")
    )
    line = one_line(cli("vectors", *args))
    assert expect in line, line
