#!/usr/bin/env bash
# The second GPU lease's run: rechecks what the first (reports/gpu.md) left open. It reproduces
# JAX's float16 compile error directly, then runs the jax adapter's half-precision cases and the
# torch adapter's whole suite (dev profile, at most SUITE_S seconds each, in parallel), with the
# runner's restart after a CUDA fault and the adapters' fixes since. Same setup as run.sh: array-api-compat as a wheel in .whl/.
#
#   OUT=/tmp/gpu-out bash examples/gpu/recheck.sh
set -u
OUT=${OUT:-/tmp/gpu-out}
R=$OUT/r
mkdir -p "$R/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-build-isolation --target /tmp/site .whl/*.whl . \
  || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false ATTNSPEC_JOBS=2
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$R/logs/gpu.txt"
python3 - <<'PY' 2>&1 | tee "$R/logs/jax-float16.txt"
# jax.nn.dot_product_attention in float16 with a size of 1 (here the head dim), eager and jitted
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)  # as attnspec's JAX backends run (seen failing so)
print("jax", jax.__version__, jax.devices())
x = jnp.asarray(np.random.default_rng(0).standard_normal((1, 1, 1, 1)), "float16")  # (B, T, N, H)
for label, fn in (("eager", jax.nn.dot_product_attention), ("jit", jax.jit(jax.nn.dot_product_attention))):
    for prec in ("highest", "default"):
        try:
            with jax.default_matmul_precision(prec):
                jax.block_until_ready(fn(x, x, x))
            print(f"float16 head dim 1, {label}, precision={prec}: ok")
        except Exception as e:
            print(f"float16 head dim 1, {label}, precision={prec}: {type(e).__name__}: {str(e)[:100]}")
PY
SUITE_S=${SUITE_S:-300}
suite() {  # backend device profile [pytest options...]
  local tag=$1-${2/:/-} b=$1 d=$2 pr=$3
  shift 3
  timeout -s INT "$SUITE_S" python3 -m attnspec.conformance.run --backend "$b" --device "$d" --profile "$pr" \
    --jobs 4 --out "$R/conformance-$tag.json" "$@" >"$R/logs/conformance-$tag.log" 2>&1
  echo "conformance $tag ($pr $*): exit $?"; tail -2 "$R/logs/conformance-$tag.log"
}
suite jax gpu:0 dev -k "float16 or bfloat16" &
suite torch cuda:0 dev &
wait
(cd "$OUT" && tar c r | xz -T0 -3 > recheck.tar.xz && rm -rf r)
ls -la "$OUT"
