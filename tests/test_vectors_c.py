"""The C99 sdpa of examples/c-sdpa against exported conformance vectors (#26).

``examples/c-sdpa/check.py`` (the one copy of the check, also run by ``nox -s vectors_c``) builds
the program and its -1e9 fill twin, exports the dev profile's sdpa vectors, runs both and
verifies: the correct build must CONFORM, the twin must FAIL naming ``sdpa.empty_row``. Here with
two dtypes, float32 and bfloat16 (16-bit outputs exercise the C's own rounding). A second test
checks that rounding bit for bit. Both skip only when there is no C compiler ``cc``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

ROOT = Path(__file__).parent.parent
EXAMPLE = ROOT / "examples" / "c-sdpa"
CC = shutil.which("cc")

pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc) on PATH")


def test_c_sdpa_conforms_and_fill_twin_fails_on_empty_row(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE / "check.py"),
            "--work",
            str(tmp_path / "c-sdpa"),
            "--cc",
            str(CC),
            "--dtype",
            "float32",
            "--dtype",
            "bfloat16",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "vectors_c: OK" in out
    # the correct build's verdict: every sdpa and serving case passed, the paged layout's declared
    assert re.search(r"\nCONFORMS \(on the (\d+) of \d+ cases it ran; (\d+) declared unsupported\)", out)
    assert "bundle family sdpa_paged: only sdpa's contiguous layout is implemented" in out
    assert re.search(r"bundle sdpa_serving-float32 \(spec [0-9.]+\): (\d+) cases, \1 passed", out)
    assert "\nFAILS: " in out  # the twin's
    assert "[clause sdpa.empty_row]" in out


HARNESS = r"""
#include "safetensors.h"
#include <stdio.h>
#include <string.h>
int main(void)
{
    unsigned long long bits;
    double x;
    while (scanf("%llx", &bits) == 1) {
        memcpy(&x, &bits, sizeof x);
        printf("%04x %04x %08lx\n", st_to_f16(x), st_to_bf16(x), (unsigned long)st_to_f32(x));
    }
    return 0;
}
"""


def _values() -> np.ndarray:
    """float64 values where rounding is delicate: exact ties between neighbours of each 16-bit
    format, one ulp (of float64) either side, overflow and subnormal edges, and random values."""
    rng = np.random.default_rng(26)
    out = [
        np.array(
            [
                0.0,
                -0.0,
                np.inf,
                -np.inf,
                np.nan,
                65504.0,
                65519.99,
                65520.0,
                1e300,
                -1e300,
                5e-324,
                2.0**-24,
                2.0**-25,
                2.0**-25 * (1 + 2**-40),
                2.0**-133,
                2.0**-134,
                2.0**-149,
                2.0**-150,
                2.0**-150 * (1 + 2**-40),
                3.3895313892515355e38,
                3.4028235677973366e38,
            ]
        )
    ]
    for dt, top in ((np.float16, 0x7C00), (ml_dtypes.bfloat16, 0x7F80)):
        bits = np.unique(rng.integers(0, top, 3000)).astype(np.uint16)
        lo = bits.view(dt).astype(np.float64)
        hi = (bits + 1).view(dt).astype(np.float64)
        mid = (lo + hi) / 2  # exact in float64
        out += [lo, mid, -mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf)]
    f32 = rng.integers(0, 0x7F800000, 3000, dtype=np.uint32)
    lo, hi = f32.view(np.float32).astype(np.float64), (f32 + 1).view(np.float32).astype(np.float64)
    out += [(lo + hi) / 2, np.nextafter((lo + hi) / 2, np.inf)]
    with np.errstate(over="ignore"):
        out.append(np.ldexp(rng.random(3000) + 1, rng.integers(-160, 140, 3000)) * rng.choice([-1, 1], 3000))
    return np.concatenate(out)


def _nearest_even(x: float, candidates: list[int], dtype) -> int:
    """The candidate bit pattern nearest to x >= 0, compared exactly (ties to an even mantissa): an
    independent reference, since ml_dtypes' float64 -> bfloat16 rounds twice (through float32)."""
    exact = Fraction(x)
    return min(
        candidates,
        key=lambda c: (abs(Fraction(float(np.uint16(c).view(dtype).astype(np.float64))) - exact), c & 1),
    )


def test_c_float_rounding_is_one_round_to_nearest_even(tmp_path: Path) -> None:
    exe = tmp_path / "convert"
    (tmp_path / "harness.c").write_text(HARNESS)
    subprocess.run(
        [
            str(CC),
            "-std=c99",
            "-O2",
            "-Wall",
            "-Wextra",
            "-pedantic",
            "-Werror",
            f"-I{EXAMPLE}",
            "-o",
            str(exe),
            str(tmp_path / "harness.c"),
            str(EXAMPLE / "safetensors.c"),
            str(EXAMPLE / "json.c"),
            "-lm",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    x = _values()
    proc = subprocess.run(
        [str(exe)],
        input="\n".join(f"{b:x}" for b in x.view(np.uint64)),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    rows = [line.split() for line in proc.stdout.splitlines()]
    assert len(rows) == len(x)
    f16 = np.array([int(r[0], 16) for r in rows], np.uint16)
    bf16 = np.array([int(r[1], 16) for r in rows], np.uint16)
    f32 = np.array([int(r[2], 16) for r in rows], np.uint32)
    nan = np.isnan(x)
    # NaN stays NaN with its sign, in every format
    for got, dt in ((f16, np.float16), (bf16, ml_dtypes.bfloat16), (f32, np.float32)):
        back = got[nan].view(dt).astype(np.float64)
        assert np.isnan(back).all() and (np.signbit(back) == np.signbit(x[nan])).all()
    # NumPy's float64 -> float16 and -> float32 casts are single correctly rounded steps
    with np.errstate(over="ignore"):
        assert (f16[~nan] == x[~nan].astype(np.float16).view(np.uint16)).all()
        assert (f32[~nan] == x[~nan].astype(np.float32).view(np.uint32)).all()
    # bfloat16 against the exact nearest neighbour (ties to even), overflow past the boundary
    boundary = float(Fraction(2) ** 128 - Fraction(2) ** (127 - 8))  # halfway from max bf16 to 2^128
    for xi, got in zip(x[~nan], bf16[~nan]):
        sign = 0x8000 if np.signbit(xi) else 0
        if abs(xi) >= boundary:
            assert got == sign | 0x7F80, (xi, hex(got))
            continue
        guess = int(np.array(abs(xi)).astype(ml_dtypes.bfloat16).view(np.uint16))
        near = [c for c in (guess - 1, guess, guess + 1) if 0 <= c < 0x7F80]
        assert got == sign | _nearest_even(abs(xi), near, ml_dtypes.bfloat16), (xi, hex(got))
    # the values include ties-plus-an-ulp where rounding through float32 (ml_dtypes) goes wrong,
    # so the check above has teeth
    with np.errstate(over="ignore"):
        assert (bf16[~nan] != x[~nan].astype(ml_dtypes.bfloat16).view(np.uint16)).sum() > 100
