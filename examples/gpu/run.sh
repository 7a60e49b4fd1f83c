#!/usr/bin/env bash
# The GPU run behind reports/results/*-cuda-0* and *-gpu-0*: the conformance suite for torch (CUDA),
# JAX (GPU) and CuPy, a bundle of conformance vectors through each of torch's SDPA kernels, then
# the benchmarks, one at a time. Written for a machine that has torch, JAX, CuPy, hypothesis and
# pytest but no network: attnspec and the few packages it lacks come as wheels in .whl/, the
# vectors as an export in .gpu/vectors (`attnspec vectors export --out .gpu/vectors --function sdpa
# --dtype float16 --dtype bfloat16 --dtype float32 --profile default`). Everything it makes goes
# to $OUT/suite.tar.xz.* and $OUT/bench.tar.xz.* (cat the parts, then untar); `attnspec vectors verify` judges the kernels' outputs afterwards, anywhere.
#
#   OUT=/tmp/gpu-out bash examples/gpu/run.sh
set -u
OUT=${OUT:-/tmp/gpu-out}
R=$OUT/r
mkdir -p "$R/suite-timings" "$R/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-build-isolation --target /tmp/site .whl/*.whl . \
  || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false ATTNSPEC_JOBS=2
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$R/logs/gpu.txt"
python3 -c 'import torch, jax, cupy; print("torch", torch.__version__, "jax", jax.__version__, jax.devices(), "cupy", cupy.__version__)' \
  | tee -a "$R/logs/gpu.txt"
JAXDEV=$(python3 -c 'import jax; d = [x for x in jax.devices() if x.platform != "cpu"][0]; print(f"{d.platform}:{d.id}")')

# Phase A, in parallel (one GPU, 16 cores): each suite stops at SUITE_S and keeps what finished.
SUITE_S=${SUITE_S:-240}
suite() {  # backend device profile
  local tag=$1-${2/:/-}
  timeout -s INT "$SUITE_S" python3 -m attnspec.conformance.run --backend "$1" --device "$2" --profile "$3" \
    --out "$R/conformance-$tag.json" --timings "$R/suite-timings" >"$R/logs/conformance-$tag.log" 2>&1
  echo "conformance $tag ($3): exit $?"
}
suite torch cuda:0 default &
suite torch-native cuda:0 default &
suite array_api-torch cuda:0 dev &
suite array_api-cupy cuda:0 dev &
suite jax "$JAXDEV" dev &
suite jax-native "$JAXDEV" dev &
suite torch-flex-native cuda:0 dev &
(timeout -s INT "$SUITE_S" python3 examples/gpu/sdpa_kernels.py .gpu/vectors "$OUT/kernels" >"$R/logs/kernels.log" 2>&1
 echo "sdpa kernels: exit $?"; tail -4 "$R/logs/kernels.log") &
wait
pack() {  # name: what $R and $OUT/kernels hold, in parts under 15 MB (a transfer's file limit)
  (cd "$OUT" && tar c r $(ls -d kernels 2>/dev/null) | xz -T0 -3 | split -b 15M - "$1.tar.xz." && rm -rf r kernels)
  mkdir -p "$R/logs"
}
pack suite

# Phase B, alone on the machine: the benchmarks.
BENCH_S=${BENCH_S:-100}
bench() {  # backend device grid [options...]
  local b=$1 d=$2 g=$3
  shift 3
  timeout -s INT "$BENCH_S" python3 -m attnspec.bench.run --backend "$b" --device "$d" --grid "$g" "$@" \
    --out "$R/bench-$b-${d/:/-}-$g.json" >"$R/logs/bench-$b-$g.log" 2>&1
  echo "bench $b $d $g: exit $?"
}
bench torch cuda:0 "${TORCH_GRID:-full}" --budget-s 0.25
bench jax "$JAXDEV" quick
bench array_api-cupy cuda:0 quick
pack bench
ls -la "$OUT"
