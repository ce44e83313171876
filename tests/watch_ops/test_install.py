"""scripts/install_prometheus.sh is idempotent: with Prometheus installed it changes nothing,
and no system Prometheus daemon is left listening (the tests start their own, on loopback)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.fakes.promserver import require_prometheus

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "install_prometheus.sh"


def test_install_script_is_idempotent_and_leaves_no_daemon() -> None:
    require_prometheus()
    r = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0, r.stderr
    assert "already installed" in r.stdout and "prometheus, version 2." in r.stdout
    # a daemon the package started runs without our loopback flags (tests/fakes/promserver.py)
    pids = subprocess.run(["pgrep", "-x", "prometheus"], capture_output=True, text=True).stdout
    for pid in pids.split():
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        assert "--web.listen-address=127.0.0.1:" in cmd, f"a system prometheus runs: {cmd}"
