#!/usr/bin/env bash
# Installs Debian's Prometheus (/usr/bin/prometheus and promtool) for the watch tests: the shipped
# alert rules are checked by `promtool check rules` / `promtool test rules`, and a real Prometheus
# started by the tests on loopback scrapes `phaselens watch --listen` (tests/watch_ops).
# Idempotent: does nothing when both binaries are already on PATH.
# The tests start their own server on a temp config and port; a system daemon that the package's
# postinst may start (it does where an init system runs and no policy-rc.d forbids it) is stopped
# by its pid, so nothing is left listening on :9090.
set -euo pipefail
if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    echo "install_prometheus: already installed ($(prometheus --version 2>&1 | head -n1))"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        echo "install_prometheus: need root or sudo to apt-get install prometheus" >&2
        exit 1
    fi
fi
before="$(pgrep -x prometheus || true)"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends prometheus
# Stop only a daemon that this install started (pids not there before), never one the user runs.
for pid in $(pgrep -x prometheus || true); do
    if ! grep -qx "$pid" <<<"$before"; then
        echo "install_prometheus: stopping the daemon the package started (pid $pid)"
        if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
            $SUDO systemctl disable --now prometheus.service || $SUDO kill "$pid"
        else
            $SUDO kill "$pid"
        fi
    fi
done
command -v prometheus
command -v promtool
promtool --version | head -n1
