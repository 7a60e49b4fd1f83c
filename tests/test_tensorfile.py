"""The safetensors reader and writer of conformance vector bundles (`attnspec.conformance.tensorfile`).

`write` gives canonical bytes every dtype round-trips through, bit for bit; `read` treats a file
as untrusted: each malformed header, size or payload raises `TensorFileError` with one line, before
anything the header declares is allocated, and nothing in a file is ever executed (no pickle).
"""

from __future__ import annotations

import json
import pickle
import struct
import tracemalloc
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from attnspec.conformance import tensorfile
from attnspec.conformance.tensorfile import DTYPES, MAX_HEADER, TensorFileError

SHAPES = [(), (0,), (3, 0, 2), (5,), (2, 3), (1, 2, 1, 3)]


def _values(code: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    dt = DTYPES[code]
    if code == "BOOL":
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
    a = rng.standard_normal(shape) * 100
    if a.size:  # the special values survive too: NaN, both infinities, -0.0, the smallest subnormal
        special = [np.nan, np.inf, -np.inf, -0.0, float(ml_dtypes.finfo(dt).smallest_subnormal)]
        a.flat[: min(a.size, len(special))] = special[: a.size]
    with np.errstate(all="ignore"):
        return a.astype(dt)


@pytest.mark.parametrize("code", list(DTYPES))
def test_every_dtype_round_trips_bit_for_bit(tmp_path, code):
    rng = np.random.default_rng(list(DTYPES).index(code))
    tensors = {f"t{i}": _values(code, shape, rng) for i, shape in enumerate(SHAPES)}
    meta = {"format": "x", "note": "ünïcode, commas, = signs"}
    data = tensorfile.write(tmp_path / "a.safetensors", tensors, meta)
    assert (tmp_path / "a.safetensors").read_bytes() == data
    got, got_meta = tensorfile.read(tmp_path / "a.safetensors")
    assert got_meta == meta
    assert sorted(got) == sorted(tensors)
    for name, a in tensors.items():
        b = got[name]
        assert b.dtype == DTYPES[code], name
        assert b.shape == a.shape, name
        assert b.tobytes() == a.tobytes(), f"{name}: not bit-identical"
        assert b.flags.writeable and b.flags.c_contiguous  # a copy, not a view of the file's buffer


def test_fp8_codes_are_the_safetensors_names_and_every_byte_reads_back():
    """F8_E4M3 is float8_e4m3fn and F8_E5M2 float8_e5m2 (the safetensors crate's Dtype names):
    all 256 bit patterns of each, NaN encodings included, come back bit for bit."""
    every = np.arange(256, dtype=np.uint8)
    for code, dt in (("F8_E4M3", ml_dtypes.float8_e4m3fn), ("F8_E5M2", ml_dtypes.float8_e5m2)):
        data = tensorfile.write_bytes({"x": every.view(dt)})
        n = struct.unpack("<Q", data[:8])[0]
        assert json.loads(data[8 : 8 + n])["x"]["dtype"] == code
        got, _ = tensorfile.parse(data)
        assert got["x"].dtype == np.dtype(dt) and got["x"].view(np.uint8).tolist() == every.tolist()
    assert float(np.array([0x7E], np.uint8).view(ml_dtypes.float8_e4m3fn)[0]) == 448.0


def test_zero_size_tensors_and_an_empty_file_of_tensors(tmp_path):
    tensorfile.write(tmp_path / "z.safetensors", {"e": np.zeros((0, 4), np.float32)})
    got, meta = tensorfile.read(tmp_path / "z.safetensors")
    assert got["e"].shape == (0, 4) and got["e"].dtype == np.float32 and meta == {}
    tensorfile.write(tmp_path / "none.safetensors", {})
    assert tensorfile.read(tmp_path / "none.safetensors") == ({}, {})


def test_write_is_canonical():
    a = {"b": np.arange(3, dtype=np.float32), "a": np.ones((2, 2), np.float64)}
    b = {"a": np.ones((2, 2), np.float64), "b": np.arange(3, dtype=np.float32)}
    data = tensorfile.write_bytes(a, {"z": "1", "y": "2"})
    assert data == tensorfile.write_bytes(b, {"y": "2", "z": "1"})  # insertion order does not matter
    (n,) = struct.unpack("<Q", data[:8])
    assert n % 8 == 0  # the header is padded to a multiple of 8 bytes, so the data is aligned
    header = json.loads(data[8 : 8 + n])
    assert list(header) == ["__metadata__", "a", "b"]
    assert header["a"] == {"data_offsets": [0, 32], "dtype": "F64", "shape": [2, 2]}
    assert header["b"] == {"data_offsets": [32, 44], "dtype": "F32", "shape": [3]}
    # big-endian input is written little-endian
    big = tensorfile.write_bytes({"x": np.arange(4, dtype=">f4")})
    assert big == tensorfile.write_bytes({"x": np.arange(4, dtype="<f4")})


def test_write_refuses_a_dtype_the_format_does_not_name():
    with pytest.raises(TypeError, match="complex"):
        tensorfile.write_bytes({"c": np.zeros(2, np.complex64)})
    with pytest.raises(TypeError, match="object"):
        tensorfile.write_bytes({"o": np.array([object()], dtype=object)})


def test_interoperates_with_the_safetensors_package(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    tensors = {
        "f64": np.linspace(-1, 1, 6).reshape(2, 3),
        "f32": np.arange(5, dtype=np.float32),
        "f16": np.arange(4, dtype=np.float16) / 3,
        "i64": np.array([-(2**62), 7], np.int64),
        "b": np.array([True, False, True]),
    }
    data = tensorfile.write_bytes(tensors, {"k": "v"})
    theirs = st.load(data)
    for name, a in tensors.items():
        assert theirs[name].dtype == a.dtype and theirs[name].tobytes() == a.tobytes(), name
    (tmp_path / "theirs.safetensors").write_bytes(st.save(tensors, metadata={"k": "v"}))
    got, meta = tensorfile.read(tmp_path / "theirs.safetensors")
    assert meta == {"k": "v"}
    for name, a in tensors.items():
        assert got[name].dtype == a.dtype and got[name].tobytes() == a.tobytes(), name


# -- hostile and malformed files -------------------------------------------------------------


def _file(header: object, data: bytes = b"", *, length: int | None = None) -> bytes:
    """A safetensors file with ``header`` (JSON-encoded unless bytes) and ``data``; ``length``
    overrides the header length field."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def _t(dtype: str, shape: list, begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


MALFORMED = {
    "empty file": (b"", "too short"),
    "shorter than the length field": (b"\x01\x00\x00", "too short"),
    "header length past the end": (_file({}, length=1000), "header length 1000 exceeds the file"),
    "header length 2**63": (_file({}, length=2**63), "header length 9223372036854775808"),
    "header length 2**64-1": (_file({}, length=2**64 - 1), "header length"),
    "header length over the limit": (_file({}, length=MAX_HEADER + 1), "header length"),
    "header not UTF-8": (_file(b"\xff\xfe{}"), "not valid UTF-8 JSON"),
    "header not JSON": (_file(b"{not json"), "not valid UTF-8 JSON"),
    "header with a NaN constant": (_file(b'{"__metadata__": {"x": NaN}}'), "not valid UTF-8 JSON"),
    "header with Infinity": (_file(b'{"a": {"dtype": "F32", "shape": [Infinity]}}'), "not valid UTF-8 JSON"),
    "header deeply nested": (_file(b"[" * 100_000 + b"]" * 100_000), "not valid UTF-8 JSON"),
    "header a list": (_file([1, 2]), "is a JSON list, expected an object"),
    "header a string": (_file("x"), "is a JSON str"),
    "entry not an object": (_file({"a": [1]}), "expected an object with exactly dtype"),
    "entry with an extra key": (_file({"a": {**_t("F32", [1], 0, 4), "x": 1}}, b"\0" * 4), "exactly dtype"),
    "entry missing data_offsets": (_file({"a": {"dtype": "F32", "shape": [1]}}, b"\0" * 4), "exactly dtype"),
    "unknown dtype": (_file({"a": _t("F8_E8M0", [1], 0, 1)}, b"\0"), "dtype 'F8_E8M0' is not one of"),
    "F8 with a byte short": (_file({"a": _t("F8_E4M3", [2, 3], 0, 5)}, b"\0" * 5), "needs 6 bytes"),
    "F8 past the file": (_file({"a": _t("F8_E5M2", [4], 0, 4)}, b"\0" * 3), "declares 4 bytes"),
    "object dtype": (_file({"a": _t("O", [1], 0, 8)}, b"\0" * 8), "is not one of"),
    "dtype not a string (a list)": (_file({"a": _t(["F32"], [1], 0, 4)}, b"\0" * 4), "is not one of"),
    "dtype not a string (an object)": (_file({"a": _t({"F32": 1}, [1], 0, 4)}, b"\0" * 4), "is not one of"),
    "dtype a number": (_file({"a": _t(7, [1], 0, 4)}, b"\0" * 4), "is not one of"),
    "negative dim": (_file({"a": _t("F32", [-1], 0, 0)}), "shape [-1] must be a list"),
    "float dim": (_file({"a": _t("F32", [1.0], 0, 4)}, b"\0" * 4), "must be a list"),
    "bool dim": (_file({"a": _t("F32", [True], 0, 4)}, b"\0" * 4), "must be a list"),
    "shape a number": (_file({"a": _t("F32", 4, 0, 16)}, b"\0" * 16), "must be a list"),
    "rank 9": (_file({"a": _t("U8", [1] * 9, 0, 1)}, b"\0"), "at most 8"),
    "dim 2**40": (_file({"a": _t("F32", [2**40], 0, 2**42)}, b"\0" * 16), "must be a list"),
    "dims whose product overflows": (_file({"a": _t("F64", [2**39] * 8, 0, 16)}, b"\0" * 16), "needs"),
    "offsets reversed": (_file({"a": _t("U8", [0], 4, 0)}), "0 <= begin <= end"),
    "offsets negative": (_file({"a": _t("U8", [1], -1, 0)}), "0 <= begin <= end"),
    "offsets of three": (
        _file({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]}}, b"\0"),
        "begin",
    ),
    "offsets huge": (_file({"a": _t("U8", [1], 2**62, 2**62 + 1)}, b"\0"), "0 <= begin <= end"),
    "size not matching the shape": (_file({"a": _t("F32", [3], 0, 8)}, b"\0" * 8), "needs 12 bytes"),
    "huge shape, consistent offsets": (_file({"a": _t("F32", [2**38], 0, 2**40)}, b"\0" * 16), "declares"),
    "offsets past the end": (_file({"a": _t("F32", [4], 0, 16)}, b"\0" * 8), "declares 16 bytes"),
    "a gap between tensors": (
        _file({"a": _t("U8", [4], 0, 4), "b": _t("U8", [4], 8, 12)}, b"\0" * 12),
        "begins at byte 8 of the data, expected 4",
    ),
    "overlapping tensors": (
        _file({"a": _t("U8", [8], 0, 8), "b": _t("U8", [4], 4, 8)}, b"\0" * 8),
        "without gaps or overlap",
    ),
    "the same bytes twice": (
        _file({"a": _t("U8", [8], 0, 8), "b": _t("U8", [8], 0, 8)}, b"\0" * 8),
        "without gaps or overlap",
    ),
    "data not starting at 0": (_file({"a": _t("U8", [4], 4, 8)}, b"\0" * 8), "begins at byte 4"),
    "trailing bytes": (_file({"a": _t("U8", [4], 0, 4)}, b"\0" * 12), "declares 4 bytes of tensor data"),
    "BOOL holding 7": (
        _file({"a": _t("BOOL", [3], 0, 3)}, b"\x01\x07\x00"),
        "holds bytes other than 0 and 1",
    ),
    "metadata not strings": (_file({"__metadata__": {"a": 1}}), "__metadata__ must be an object of strings"),
    "metadata a list": (_file({"__metadata__": ["a"]}), "__metadata__ must be an object of strings"),
    "a pickle": (pickle.dumps({"a": np.arange(3)}), "header length"),
    "a pickle after a header": (_file(b"\x80\x04\x95", pickle.dumps(np.arange(3))), "not valid UTF-8 JSON"),
}


@pytest.mark.parametrize("what", list(MALFORMED))
def test_read_rejects_a_malformed_file_in_one_line(tmp_path, what):
    data, expect = MALFORMED[what]
    path = tmp_path / "bad.safetensors"
    path.write_bytes(data)
    with pytest.raises(TensorFileError) as info:
        tensorfile.read(path)
    text = str(info.value)
    assert "\n" not in text, text
    assert text.startswith(str(path)), text  # names the file
    assert expect in text, text


def test_read_limits_the_tensor_data_to_max_bytes(tmp_path):
    path = tmp_path / "big.safetensors"
    tensorfile.write(path, {"a": np.zeros(1024, np.float64)})
    assert tensorfile.read(path, max_bytes=8192)[0]["a"].shape == (1024,)
    with pytest.raises(TensorFileError, match="8192 bytes of tensor data, more than the limit of 8191"):
        tensorfile.read(path, max_bytes=8191)


def test_hostile_sizes_allocate_nothing_they_declare(tmp_path):
    hostile = [
        "header length 2**63",
        "header length over the limit",
        "dim 2**40",
        "dims whose product overflows",
        "huge shape, consistent offsets",
        "offsets huge",
    ]
    tracemalloc.start()
    try:
        for what in hostile:
            path = tmp_path / "h.safetensors"
            path.write_bytes(MALFORMED[what][0])
            tracemalloc.reset_peak()
            with pytest.raises(TensorFileError):
                tensorfile.read(path)
            _, peak = tracemalloc.get_traced_memory()
            assert peak < 2**20, (
                f"{what}: {peak} bytes allocated while reading a {path.stat().st_size}-byte file"
            )
    finally:
        tracemalloc.stop()


def test_a_missing_file_is_an_os_error(tmp_path):
    with pytest.raises(OSError):
        tensorfile.read(tmp_path / "absent.safetensors")


def test_never_unpickles(tmp_path, monkeypatch):
    """A pickle, or a file whose data is a pickle, is data: rejected as malformed or returned as
    bytes, and no loader that could run code is called."""

    def boom(*args, **kwargs):
        raise AssertionError("tensorfile.read called a pickle loader")

    for mod, name in ((pickle, "load"), (pickle, "loads"), (pickle, "Unpickler"), (np, "load")):
        monkeypatch.setattr(mod, name, boom)
    payload = b"cos\nsystem\n(S'echo pwned'\ntR."  # a protocol-0 pickle that would run a command
    path = tmp_path / "p.safetensors"
    path.write_bytes(payload)
    with pytest.raises(TensorFileError):
        tensorfile.read(path)
    path.write_bytes(_file({"a": _t("U8", [len(payload)], 0, len(payload))}, payload))
    got, _ = tensorfile.read(path)
    assert got["a"].tobytes() == payload  # bytes, nothing more
    source = Path(tensorfile.__file__).read_text()
    assert "import pickle" not in source and "allow_pickle" not in source
