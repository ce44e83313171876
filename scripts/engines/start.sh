#!/usr/bin/env bash
# Start a real engine on a local model in the background; prints "READY pid=... url=..." when it
# serves. Stop it with:  bash scripts/engines/start.sh stop PIDFILE
#   bash scripts/engines/start.sh llamacpp|vllm [--port N] [--size tiny|m] [--name NAME] [--parallel 16]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = stop ] || [ "${1:-}" = check ]; then
  exec python3 "$HERE/engines.py" "$@"
fi
exec python3 "$HERE/engines.py" start "$@"
