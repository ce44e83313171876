"""The nvidia-smi CSV loop: the GPU source when the NVML bindings are missing but the binary
exists (a container with the driver tools and no nvidia-ml-py).

Why its own timestamps: through a pipe nvidia-smi's output may arrive in bursts, so each line is
stamped with the timestamp nvidia-smi printed (local wall time, ms), mapped onto the run clock.
"""

from __future__ import annotations

import datetime as _dt
import shutil
import subprocess
import threading
from collections.abc import Sequence

from phaselens.telemetry.clock import RunClock
from phaselens.telemetry.source import Unavailable
from phaselens.types import TelemetrySample

SOURCE = "smi"
# (query field, canonical metric, scale); the first two fields are timestamp and index
FIELDS: tuple[tuple[str, str, float], ...] = (
    ("utilization.gpu", "gpu.busy_pct", 1.0),
    ("utilization.memory", "gpu.mem_busy_pct", 1.0),
    ("power.draw", "gpu.power_w", 1.0),
    ("clocks.sm", "gpu.sm_clock_mhz", 1.0),
    ("clocks.mem", "gpu.mem_clock_mhz", 1.0),
    ("memory.used", "gpu.mem_used_bytes", 1024.0 * 1024.0),  # MiB
)
QUERY = ",".join(["timestamp", "index", *(f for f, _, _ in FIELDS)])


def smi_command(binary: str, interval_s: float) -> list[str]:
    ms = max(1, round(interval_s * 1000))
    return [binary, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", f"-lms={ms}"]


def parse_smi_line(line: str, clock: RunClock) -> list[TelemetrySample]:
    """One CSV line -> samples at nvidia-smi's timestamp; `[N/A]`-like fields are skipped."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 2 + len(FIELDS):
        return []
    try:
        wall = _dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
    except ValueError:
        return []
    t = clock.from_wall_ns(round(wall * 1e9))
    labels = {"gpu": parts[1]}
    out = []
    for (_, metric, scale), raw in zip(FIELDS, parts[2:], strict=False):
        try:
            value = float(raw) * scale
        except ValueError:
            continue
        out.append(TelemetrySample(t, SOURCE, metric, value, labels))
    return out


class SmiSource:
    """Runs the nvidia-smi loop; a reader thread parses lines, `tick` hands them over."""

    def __init__(self, cmd: Sequence[str], clock: RunClock) -> None:
        self.name = SOURCE
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: list[TelemetrySample] = []
        self._lines = 0
        self._closed = False
        self._proc = subprocess.Popen(
            list(cmd), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self._reader = threading.Thread(target=self._read, name="telemetry-smi", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            samples = parse_smi_line(line, self._clock)
            with self._lock:
                self._pending += samples
                self._lines += 1 if samples else 0

    def tick(self) -> list[TelemetrySample]:
        with self._lock:
            out, self._pending = self._pending, []
        return out

    def missed(self, t_ns: int) -> list[TelemetrySample]:
        return []

    def statuses(self) -> dict[str, str]:
        rc = self._proc.poll()
        if rc is not None and not self._closed:
            return {SOURCE: f"unavailable: nvidia-smi exited with {rc}"}
        if self._closed and self._lines == 0:
            return {SOURCE: "unavailable: nvidia-smi printed no readable line"}
        return {SOURCE: "ok"}

    def close(self) -> None:
        self._closed = True
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(2.0)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(2.0)
        self._reader.join(2.0)
        with self._lock:
            self._pending.clear()


def open_smi(clock: RunClock, interval_s: float = 0.1, binary: str = "nvidia-smi") -> SmiSource:
    """Check that nvidia-smi works (`-L`), then start its loop; else Unavailable with why."""
    path = shutil.which(binary)
    if path is None:
        raise Unavailable(f"{binary} not found")
    try:
        check = subprocess.run(
            [path, "-L"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Unavailable(f"{binary} -L failed: {e}") from None
    if check.returncode != 0 or "GPU" not in check.stdout:
        first = (check.stdout + check.stderr).strip().splitlines()[:1]
        raise Unavailable(f"{binary} sees no GPU ({first[0] if first else check.returncode})")
    return SmiSource(smi_command(path, interval_s), clock)
