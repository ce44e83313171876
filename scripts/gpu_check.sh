#!/usr/bin/env bash
# GPU check for phaselens' telemetry (docs/telemetry.md, "GPU check"): a compute-bound and a
# bandwidth-bound PyTorch phase, sampled through phaselens' sampler; prints SM % and DRAM BW %
# per phase. Without a GPU it prints one "no GPU" line and exits 0. Under 5 minutes.
# Uses the project's venv when it has torch, else python3 (e.g. a CUDA image with PyTorch).
set -euo pipefail
cd "$(dirname "$0")/.."
py=python3
if [ -x .venv/bin/python ] && .venv/bin/python -c "import torch" 2>/dev/null; then
  py=.venv/bin/python
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
exec "$py" scripts/gpu_check.py ${OUT:+--out "$OUT"} "$@"
