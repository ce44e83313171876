#!/usr/bin/env bash
# Download, here (where pip can reach its index), the wheels that scripts/gpu_e2e.sh installs on
# the GPU machine (no network there): phaselens' dependencies that the device image lacks, for
# CPython 3.12 manylinux x86_64, into .whl/ (ignored by git). The image already has numpy,
# pyarrow, rich, typer, prometheus-client, pyyaml, jinja2, uvloop, aiohttp, torch, transformers
# (/work/.library/device/KINDS.md); plotly is left out: only `phaselens report`/`compare` and the
# what-if HTML page draw figures, and the check runs none of them.
#   bash scripts/gpu_e2e_wheels.sh [DIR]      # prints the wheels and the size to be carried
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.whl}
# The versions the project's tests run with (make test); one version each (two stop the install).
PKGS=(
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  typing-extensions==4.16.0 polars==2.1.0 polars-runtime-32==2.1.0
)
mkdir -p "$DIR"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d "$DIR" "${PKGS[@]}"
ls -l "$DIR"
echo "wheels: $(du -sk "$DIR" | cut -f1) KiB in $DIR"
# What one device call carries: the working tree git would copy (tracked + untracked, not
# ignored) plus the wheel folder; the limit is 64 MiB.
tree_kib=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 du -ck 2>/dev/null | tail -1 | cut -f1)
echo "working tree: ${tree_kib} KiB; carried in all: $((tree_kib + $(du -sk "$DIR" | cut -f1))) KiB (limit 65536 KiB)"
