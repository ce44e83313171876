"""The live findings on a scripted engine and GPU: raised and cleared at the expected times
(± one window), and the exporter's numbers against hand-computed values.

One watch (windows 1 s and 3 s, ~21 s) over this script, engine time = watch time:
  0-4 s   steady decode: 500 prompt + 2000 generated tok/s, 8 running, KV 50%, SM 90%,
          TTFT all 0.2 s, ITL all 0.01 s, prefix cache 100 hits / 1000 queries a second
  4-10 s  SM 5%, busy 10% (a utilization drop), ITL 0.08 s
  6-11 s  KV 95% (pressure)
  10-13 s SM 90% again, ITL 0.01 s
  13- s   SM 25%, DRAM bandwidth 60% in decode bins (bandwidth-bound decode)
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from tests.fakes.fake_nvml import FakeGpu, make_fake
from tests.fakes.scripted_engine import Phase, ScriptedEngine

from phaselens.watch.config import WatchConfig, WatchResult
from phaselens.watch.engines import parse_engines
from phaselens.watch.hysteresis import CLEAR_HOLD_S, RAISE_HOLD_S
from phaselens.watch.loop import watch
from phaselens.watch.panel import render

SHORT, LONG = 1.0, 3.0
DURATION = float(__import__("os").environ.get("W20_DUR", "21"))
STEADY = dict(prompt_tps=500, gen_tps=2000, running=8, waiting=0, hits_ps=100, queries_ps=1000)


def _script() -> list[Phase]:
    ttft = (0.2, 20.0)
    return [
        Phase(0, kv=0.5, ttft_obs=ttft, itl_obs=(0.01, 400), **STEADY),
        Phase(4, kv=0.5, ttft_obs=ttft, itl_obs=(0.08, 400), **STEADY),
        Phase(6, kv=0.95, ttft_obs=ttft, itl_obs=(0.08, 400), **STEADY),
        Phase(10, kv=0.95, ttft_obs=ttft, itl_obs=(0.01, 400), **STEADY),
        Phase(11, kv=0.5, ttft_obs=ttft, itl_obs=(0.01, 400), **STEADY),
    ]


def _gpu_at(t: float) -> tuple[float, float, float]:
    """(SM %, busy %, DRAM bandwidth %) of the scripted GPU at engine time t."""
    if 4 <= t < 10:
        return 5.0, 10.0, 5.0
    if t >= 13:
        return 25.0, 95.0, 60.0
    return 90.0, 95.0, 20.0


class _Run:
    def __init__(self) -> None:
        self.res: WatchResult | None = None
        self.metrics_text = ""
        self.snapshots: list[Any] = []


@pytest.fixture(scope="module")
def scripted_run() -> Iterator[_Run]:
    eng = ScriptedEngine(_script()).start()
    gpu = FakeGpu(buffer=None, gpm=True, gpm_values={2: 90.0, 10: 20.0}, util=(95, 10))
    nv = make_fake([gpu])
    run = _Run()
    done = threading.Event()

    def drive_gpu() -> None:
        while not done.is_set():
            sm, busy, bw = _gpu_at(eng.now())
            gpu.gpm_values = {2: sm, 10: bw}
            gpu.util = (int(busy), 10)
            time.sleep(0.02)

    def scrape_once(port: int) -> None:
        while eng.now() < 3.5 and not done.is_set():
            time.sleep(0.05)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            run.metrics_text = r.read().decode()

    def ready(res: WatchResult) -> None:
        eng.reset_clock()
        threading.Thread(target=drive_gpu, daemon=True).start()
        assert res.port is not None
        threading.Thread(target=scrape_once, args=(res.port,), daemon=True).start()

    cfg = WatchConfig(
        engines=parse_engines([f"e1={eng.url}"]),
        gpu=True,
        listen="127.0.0.1:0",
        windows_s=(SHORT, LONG),
        duration_s=DURATION,
        quiet=True,
    )
    import io

    try:
        run.res = watch(cfg, nv=nv, out=io.StringIO(), on_ready=ready)
        yield run
    finally:
        done.set()
        eng.close()


def _times(run: _Run, code: str, engine: str) -> list[tuple[bool, float]]:
    assert run.res is not None
    return [(c.raised, c.t_s) for c in run.res.changes if c.code == code and c.engine == engine]


def _near(got: float, want: float, tol: float = LONG) -> bool:
    return abs(got - want) <= tol


def test_util_drop_raises_and_clears(scripted_run: _Run) -> None:
    ch = _times(scripted_run, "util-drop", "all")
    assert [r for r, _ in ch][:2] == [True, False], ch
    # the seed's rule needs the low run to last > 3 s; then RAISE_HOLD_S
    assert _near(ch[0][1], 4 + 3 + RAISE_HOLD_S), ch
    assert _near(ch[1][1], 10 + CLEAR_HOLD_S), ch


def test_util_drop_with_itl_rise(scripted_run: _Run) -> None:
    ch = _times(scripted_run, "util-drop-itl-rise", "all")
    assert ch and ch[0][0], ch
    assert _near(ch[0][1], 4 + 3 + RAISE_HOLD_S), ch
    assert any(not r and _near(t, 10 + CLEAR_HOLD_S) for r, t in ch), ch


def test_kv_pressure_raises_and_clears(scripted_run: _Run) -> None:
    ch = _times(scripted_run, "kv-pressure", "e1")
    assert [r for r, _ in ch] == [True, False], ch
    assert _near(ch[0][1], 6 + RAISE_HOLD_S), ch
    assert _near(ch[1][1], 11 + SHORT + CLEAR_HOLD_S), ch


def test_decode_bandwidth_bound_raises(scripted_run: _Run) -> None:
    ch = _times(scripted_run, "decode-bandwidth-bound", "all")
    assert ch and ch[0][0], ch
    # the median of the long window's decode bins crosses when half of it is past t = 13
    assert _near(ch[0][1], 13 + LONG / 2 + RAISE_HOLD_S), ch


def test_prefix_cache_low_raises_and_others_stay_quiet(scripted_run: _Run) -> None:
    ch = _times(scripted_run, "prefix-cache-low", "e1")
    assert ch and ch[0][0] and _near(ch[0][1], 1 + RAISE_HOLD_S), ch
    assert not _times(scripted_run, "load-insufficient", "all")  # 8 running, GPU busy


def test_exporter_values_match_hand_computed(scripted_run: _Run) -> None:
    text = scripted_run.metrics_text
    assert text, "the exporter was not scraped"
    got: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            got[(s.name, tuple(sorted(s.labels.items())))] = s.value

    def val(name: str, **labels: str) -> float:
        return got[(name, tuple(sorted(labels.items())))]

    # every TTFT observation is 0.2 s: in the (0.1, 0.25] bucket, so Prometheus' interpolation
    # gives 0.1 + 0.15 * 0.9 = 0.235; every ITL 0.01 s: 0.005 + 0.005 * 0.99
    for w in ("1s", "3s"):
        assert val("phaselens_ttft_p90_seconds", engine="e1", window=w) == pytest.approx(0.235)
        assert val("phaselens_itl_p99_seconds", engine="e1", window=w) == pytest.approx(0.00995)
        assert val("phaselens_prefix_cache_hit_ratio", engine="e1", window=w) == pytest.approx(
            0.1, abs=0.02
        )
    prompt = val("phaselens_tokens_per_second", engine="e1", kind="prompt", window="3s")
    gen = val("phaselens_tokens_per_second", engine="e1", kind="generation", window="3s")
    assert prompt == pytest.approx(500, rel=0.2) and gen == pytest.approx(2000, rel=0.2)
    assert val("phaselens_engine_up", engine="e1") == 1.0
    assert val("phaselens_kv_usage_ratio", engine="e1") == pytest.approx(0.5)
    assert val("phaselens_running_requests", engine="e1") == 8.0
    assert val("phaselens_running_requests_mean", engine="e1", window="3s") == pytest.approx(8.0)
    # 500 / 2500 of the tokens are prefill: every bin is a decode bin (share <= 0.3)
    assert val("phaselens_phase_share_ratio", engine="e1", phase="decode", window="3s") > 0.8
    assert val("phaselens_gpu_util_ratio", gpu="0", window="3s") == pytest.approx(0.9, abs=0.02)
    assert val("phaselens_decode_util_trough_ratio", gpu="0", window="3s") == pytest.approx(
        0.9, abs=0.02
    )
    assert ("phaselens_prefill_util_peak_ratio", (("gpu", "0"), ("window", "3s"))) not in got
    assert val("phaselens_watch_cpu_ratio") >= 0.0
    assert val("phaselens_finding_active", code="prefix-cache-low", engine="e1") == 1.0


def test_panel_fits_80_columns(scripted_run: _Run) -> None:
    assert scripted_run.res is not None and scripted_run.res.snapshot is not None
    console = Console(width=80, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(render(scripted_run.res.snapshot, {"ttft_ms": {"p90": 100.0}}))
    text = console.export_text()
    lines = text.splitlines()
    assert lines and all(len(line) <= 80 for line in lines), text
    assert "e1" in text and "util" in text and "findings:" in text
    assert "235ms!" in text  # TTFT p90 235 ms breaks the 100 ms target
