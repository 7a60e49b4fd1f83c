"""Reading and writing the safetensors files of conformance vector bundles, as untrusted data.

The format (https://huggingface.co/docs/safetensors, "Format"): 8 bytes, the header's length N as
a little-endian unsigned 64-bit integer; N bytes of UTF-8 JSON, an object mapping each tensor's
name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets into the data that follows
the header) and an optional ``"__metadata__"`` object of string values; then the data, row-major
and little-endian. Readers exist for C/C++, Rust (the ``safetensors`` crate), JavaScript and
Python, and the format names float16 (``F16``), bfloat16 (``BF16``) and the two FP8 formats
(``F8_E4M3``: float8_e4m3fn, no infinities; ``F8_E5M2``: float8_e5m2) natively, which NumPy's
``.npy`` does not (none is a NumPy type; ml_dtypes provides them); it holds no code, unlike pickle.

`write` produces canonical bytes: tensors in name order, the header's keys sorted, no spaces,
padded with spaces to a multiple of 8 bytes. `read` trusts nothing it reads: the file's size, the
header's length (at most `MAX_HEADER`), its JSON, every entry's dtype, shape (non-negative ints,
at most `MAX_RANK` dims), byte count (``prod(shape) * itemsize`` must equal ``end - begin``, and
the total at most ``max_bytes``) and offsets (inside the file, in order, without gaps or overlap)
are checked before any array is made, so a corrupted or hostile file raises `TensorFileError`
with one line saying what is wrong, never allocates more than the file holds, and never executes
anything.
"""

from __future__ import annotations

import json
import math
import os
import struct
from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["DTYPES", "MAX_HEADER", "TensorFileError", "parse", "read", "write", "write_bytes"]

#: safetensors dtype code -> NumPy dtype (little-endian)
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    # the safetensors crate's names; one byte each, every bit pattern a value (NaN included)
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_CODES = {dt: code for code, dt in DTYPES.items()}
#: the longest header read (the safetensors crate's own limit is 100 MB; ours are a few kB)
MAX_HEADER = 16 * 2**20
MAX_RANK = 8
#: the most tensor data one file may declare, unless the caller says otherwise
MAX_BYTES = 2**31


class TensorFileError(ValueError):
    """A file that is not a valid safetensors file of the allowed size: one line, what is wrong."""


def write_bytes(tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> bytes:
    """The canonical safetensors bytes of ``tensors`` (name -> array) and ``metadata``."""
    header: dict[str, Any] = {}
    chunks = []
    offset = 0
    for name in sorted(tensors):
        a = np.asarray(tensors[name])
        dt = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
        code = _CODES.get(np.dtype(dt))
        if code is None:
            raise TypeError(
                f"write: tensor {name!r} has dtype {a.dtype}, expected one of "
                f"{', '.join(str(d) for d in DTYPES.values())}"
            )
        raw = np.ascontiguousarray(a, dtype=dt).tobytes()
        header[name] = {"dtype": code, "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def write(
    path: str | os.PathLike, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None
) -> bytes:
    """Write ``tensors`` to ``path`` (see `write_bytes`); returns the bytes written."""
    data = write_bytes(tensors, metadata)
    with open(path, "wb") as f:
        f.write(data)
    return data


def read(path: str | os.PathLike, max_bytes: int = MAX_BYTES) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(tensors, metadata) of the safetensors file ``path``, every size checked before it is used
    (module docstring); `TensorFileError` for anything malformed, `OSError` if it cannot be read."""
    where = os.fspath(path)
    size = os.path.getsize(where)
    if size > 8 + MAX_HEADER + max_bytes:  # nothing valid is this large: not read at all
        raise TensorFileError(
            f"{where}: {size} bytes, more than a header and {max_bytes} bytes of tensor data"
        )
    with open(where, "rb") as f:
        data = f.read(size)
    return parse(data, where, max_bytes)


def parse(
    data: bytes, where: str = "<bytes>", max_bytes: int = MAX_BYTES
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(tensors, metadata) of a safetensors file's bytes, checked as `read` checks a file."""
    size = len(data)
    if size < 8:
        raise TensorFileError(f"{where}: {size} bytes, too short for a safetensors header (at least 8)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER or n > size - 8:
        raise TensorFileError(
            f"{where}: header length {n} exceeds "
            f"{'the file' if n > size - 8 else f'the limit of {MAX_HEADER} bytes'}"
            f" ({size} bytes)"
        )
    data_size = size - 8 - n
    if data_size > max_bytes:
        raise TensorFileError(
            f"{where}: {data_size} bytes of tensor data, more than the limit of {max_bytes}"
        )
    header = _parse_header(where, data[8 : 8 + n])
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise TensorFileError(f"{where}: __metadata__ must be an object of strings")
    entries = sorted(((name, _entry(where, name, e)) for name, e in header.items()), key=lambda x: x[1][2])
    expect = 0
    for name, (_, _, begin, end) in entries:
        if begin != expect:
            raise TensorFileError(
                f"{where}: tensor {name!r} begins at byte {begin} of the data, expected {expect}"
                " (tensors must be contiguous, without gaps or overlap)"
            )
        expect = end
    if expect != data_size:
        raise TensorFileError(
            f"{where}: the header declares {expect} bytes of tensor data, the file holds {data_size}"
        )
    body = memoryview(data)[8 + n :]
    tensors = {}
    for name, (dt, shape, begin, end) in entries:
        if dt == DTYPES["BOOL"] and (np.frombuffer(body, np.uint8, end - begin, begin) > 1).any():
            raise TensorFileError(f"{where}: tensor {name!r} is BOOL but holds bytes other than 0 and 1")
        tensors[name] = (
            np.frombuffer(body, dtype=dt, count=math.prod(shape), offset=begin).reshape(shape).copy()
        )
    return tensors, metadata


def _parse_header(where: str, raw: bytes) -> dict[str, Any]:
    try:
        header = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError, RecursionError) as e:
        raise TensorFileError(
            f"{where}: the header is not valid UTF-8 JSON ({str(e).splitlines()[0][:120]})"
        ) from None
    if not isinstance(header, dict):
        raise TensorFileError(f"{where}: the header is a JSON {type(header).__name__}, expected an object")
    return header


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _entry(where: str, name: str, e: Any) -> tuple[np.dtype, tuple[int, ...], int, int]:
    """(dtype, shape, begin, end) of one header entry, each checked."""
    what = f"{where}: tensor {name!r}"
    if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
        raise TensorFileError(
            f"{what}: expected an object with exactly dtype, shape and data_offsets, got {_short(e)}"
        )
    code, shape, offsets = e["dtype"], e["shape"], e["data_offsets"]
    if not isinstance(code, str) or code not in DTYPES:
        raise TensorFileError(f"{what}: dtype {_short(code)} is not one of {', '.join(DTYPES)}")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_RANK
        or not all(type(s) is int and 0 <= s < 2**40 for s in shape)
    ):
        raise TensorFileError(
            f"{what}: shape {_short(shape)} must be a list of at most {MAX_RANK} non-negative integers"
        )
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(o) is int and 0 <= o < 2**62 for o in offsets)
        or offsets[1] < offsets[0]
    ):
        raise TensorFileError(
            f"{what}: data_offsets {_short(offsets)} must be [begin, end] with 0 <= begin <= end"
        )
    dt = DTYPES[code]
    nbytes = math.prod(shape) * dt.itemsize
    if nbytes != offsets[1] - offsets[0]:
        raise TensorFileError(
            f"{what}: shape {shape} of {code} needs {nbytes} bytes, data_offsets span "
            f"{offsets[1] - offsets[0]}"
        )
    return dt, tuple(shape), offsets[0], offsets[1]


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."
