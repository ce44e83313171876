#!/usr/bin/env bash
# GPU end-to-end check (docs/telemetry.md, "How to run the GPU check"): scripts/gpu_check.sh,
# then a real LLM server (scripts/tfserve.py: transformers' continuous batching, a random-weight
# model with Llama-3.1-8B's shapes in bf16) driven by phaselens at three Poisson rates with
# NVML/GPM and engine telemetry at 100 ms, against the simulator's prediction for one H200,
# then one short profiled run (--profile stages,alone,steps=16: tfserve's torch.profiler
# trace of its engine steps, read by `phaselens timeline`).
# Without a GPU it rehearses the same path on the CPU with the tiny test model (GPU parts say
# "no GPU"). About 6 minutes on an H200; output (tarballs, summary.json, summary.txt) in $OUT.
#   bash scripts/gpu_e2e_wheels.sh            # here first: the wheels the GPU image lacks (.whl/)
#   OUT=DIR bash scripts/gpu_e2e.sh [--mode auto|gpu|cpu] [--stage-s S] [--budget-s S]
# PY: python for phaselens (default python3); TFSERVE_PY: python with torch + transformers for
# the server (default $PY); TFSERVE_ARGS: extra tfserve.py flags; WHEELS: the wheel folder
# (default .whl). A shorter rerun: --stage-s 20 --budget-s 200 (about 4 minutes).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_e2e_out}
PY=${PY:-python3}
WHEELS=${WHEELS:-.whl}
mkdir -p "$OUT"
if ! "$PY" -c "import polars, pydantic" 2>/dev/null; then
  if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    echo "gpu_e2e: FAIL: $PY lacks polars/pydantic and $WHEELS/ holds no wheels (run bash scripts/gpu_e2e_wheels.sh here and carry $WHEELS)"
    exit 1
  fi
  site=${TMPDIR:-/tmp}/gpu_e2e_site
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "$WHEELS"/*.whl || { echo "gpu_e2e: FAIL: wheel install"; exit 1; }
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PHASELENS_PY="$PY" TFSERVE_PY="${TFSERVE_PY:-$PY}"
t0=$(date +%s)
OUT="$OUT" bash scripts/gpu_check.sh
echo "gpu_e2e: gpu_check.sh exit $? after $(( $(date +%s) - t0 )) s"
"$PY" scripts/gpu_e2e.py --out "$OUT" "$@"
rc=$?
echo "gpu_e2e: exit $rc after $(( $(date +%s) - t0 )) s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
exit $rc
