"""The watch's pure parts: histogram quantiles, window names, engine and listen parsing, the
hysteresis, counter resets; and the CLI's bad-input lines."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from phaselens.cli import invoke
from phaselens.errors import InputError
from phaselens.telemetry.prometheus import Scrape, parse_prometheus
from phaselens.types import BIN_NS, TelemetrySample
from phaselens.watch.engines import (
    WATCH_SOURCE,
    EngineSpec,
    bucket_totals,
    counter_reset,
    histogram_increments,
    parse_engines,
    pick_histograms,
)
from phaselens.watch.exporter import parse_listen
from phaselens.watch.hysteresis import CLEAR_HOLD_S, RAISE_HOLD_S, Tracker, Verdict
from phaselens.watch.indicators import histogram_quantile, window_name
from phaselens.watch.state import GRACE_NS, WatchState


def test_histogram_quantile_by_hand() -> None:
    les = [0.1, 0.2, 0.4, math.inf]
    # 10 observations <= 0.1, 30 in (0.1, 0.2], 50 in (0.2, 0.4], 10 above: cumulative increments
    inc = np.array([10.0, 40.0, 90.0, 100.0])
    # p90: rank 90 is the top of (0.2, 0.4]: 0.4; p50: rank 50 -> 0.2 + 0.2 * (50 - 40) / 50
    assert histogram_quantile(0.9, les, inc) == pytest.approx(0.4)
    assert histogram_quantile(0.5, les, inc) == pytest.approx(0.24)
    assert histogram_quantile(0.05, les, inc) == pytest.approx(0.05)  # first bucket from 0
    assert histogram_quantile(0.99, les, inc) == pytest.approx(0.4)  # in +Inf: largest bound
    assert histogram_quantile(0.9, les, np.zeros(4)) is None


def test_window_names() -> None:
    assert [window_name(w) for w in (10, 300, 90, 1, 0.5, 3600)] == [
        "10s",
        "5m",
        "90s",
        "1s",
        "0.5s",
        "60m",
    ]


def test_parse_engines_and_listen() -> None:
    e = parse_engines(["http://127.0.0.1:8000/v1", "big=http://h:9/metrics"])
    assert [(x.name, x.url) for x in e] == [
        ("127.0.0.1:8000", "http://127.0.0.1:8000/metrics"),
        ("big", "http://h:9/metrics"),
    ]
    with pytest.raises(InputError, match="twice"):
        parse_engines(["a=http://h:1", "a=http://h:2"])
    with pytest.raises(InputError):
        parse_engines([])
    assert parse_listen("127.0.0.1:9400") == ("127.0.0.1", 9400)
    assert parse_listen(":9400") == ("0.0.0.0", 9400)
    with pytest.raises(InputError):
        parse_listen("nope")


def _scrape(text: str) -> Scrape:
    return Scrape(0, parse_prometheus(text))


def _text(tokens: int, le01: int, n: int, total: float) -> str:
    return (
        f"# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total {tokens}\n"
        "# TYPE vllm:time_to_first_token_seconds histogram\n"
        f'vllm:time_to_first_token_seconds_bucket{{le="0.1"}} {le01}\n'
        f'vllm:time_to_first_token_seconds_bucket{{le="+Inf"}} {n}\n'
        f"vllm:time_to_first_token_seconds_count {n}\n"
        f"vllm:time_to_first_token_seconds_sum {total}\n"
    )


def test_counter_reset_and_histogram_increments() -> None:
    a, b, r = _text(100, 4, 10, 2.0), _text(130, 6, 15, 3.5), _text(5, 1, 2, 0.5)
    assert not counter_reset(_scrape(a), _scrape(b))
    assert counter_reset(_scrape(b), _scrape(r))
    fam = "vllm:time_to_first_token_seconds"
    ba, bb, br = (bucket_totals(t.splitlines(), [fam])[fam] for t in (a, b, r))
    assert ba == {0.1: 4.0, math.inf: 10.0}
    inc, total = histogram_increments(ba, bb, 2.0, 3.5)
    assert inc == {0.1: 2.0, math.inf: 5.0} and total == pytest.approx(1.5)
    inc, total = histogram_increments(bb, br, 3.5, 0.5)  # a reset: counted from 0, not negative
    assert inc == {0.1: 1.0, math.inf: 2.0} and total == 0.5
    assert pick_histograms({fam: ba}) == {"ttft": fam}
    assert histogram_increments(None, ba, None, 2.0)[0] == ba


def test_hysteresis_holds() -> None:
    tr = Tracker()
    key = ("kv-pressure", "e")
    up, down, neither = (
        Verdict(True, False, {}),
        Verdict(False, True, {}),
        Verdict(False, False, {}),
    )
    t = 0.0
    assert tr.step(key, up, t, "") is None
    assert tr.step(key, neither, t + 0.5, "") is None  # the condition broke: the hold restarts
    assert tr.step(key, up, t + 1.0, "") is None
    ch = tr.step(key, up, t + 1.0 + RAISE_HOLD_S, "")
    assert ch is not None and ch.raised
    assert tr.step(key, up, t + 5.0, "") is None  # raised stays raised
    assert tr.step(key, down, t + 6.0, "") is None
    assert tr.step(key, down, t + 6.0 + CLEAR_HOLD_S - 0.1, "") is None
    ch = tr.step(key, down, t + 6.0 + CLEAR_HOLD_S, "")
    assert ch is not None and not ch.raised
    assert tr.counts()[key] == 2 and tr.active()[key] is False


def test_cli_bad_input_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (
        ["watch"],
        ["watch", "--engine", "ftp://x"],
        ["watch", "--engine", "http://127.0.0.1:9", "--listen", "nope"],
        ["watch", "--engine", "http://127.0.0.1:9", "--window", "0.1"],
        ["watch", "--engine", "http://127.0.0.1:9", "--slo", "ttft_ms=1"],
    ):
        assert invoke(args) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("phaselens: error:") and err.count("\n") == 1, (args, err)


def test_run_listen_refused_for_the_simulator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(
        "name: t\nduration_s: 2\nmodels:\n  - name: m\n    rate: 1\n"
        "    input_tokens: {type: fixed, value: 10}\n    output_tokens: {type: fixed, value: 5}\n"
    )
    code = invoke(
        ["run", str(spec), "--target", "sim", "--listen", "127.0.0.1:9", "--out", str(tmp_path)]
    )
    err = capsys.readouterr().err
    assert code == 2 and "--listen" in err and err.count("\n") == 1, err
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]  # no run directory was made


def test_write_assets_copies_what_is_shipped(tmp_path: Path) -> None:
    from phaselens.cli.watch import write_assets

    src = tmp_path / "src"
    src.mkdir()
    (src / "dashboard.json").write_text('{"title": "x"}')
    out = write_assets(tmp_path / "out", src)
    assert [p.name for p in out] == ["dashboard.json"]
    assert (tmp_path / "out" / "dashboard.json").read_text() == '{"title": "x"}'
    with pytest.raises(InputError):
        write_assets(tmp_path / "out2", tmp_path / "missing")


def test_running_mean_over_the_window_by_hand() -> None:
    """A 100 ms scrape sees running = 0 for 1 s, then 6 for 1 s, then 2: each bin holds the
    value last scraped when it closed (GRACE_NS after its end), the window's mean is theirs."""
    from phaselens.telemetry.scrape import SCRAPE_SOURCE
    from phaselens.types import BIN_NS, TelemetrySample
    from phaselens.watch.engines import EngineSpec
    from phaselens.watch.indicators import engine_figures
    from phaselens.watch.state import GRACE_NS, WatchState

    spec = EngineSpec("e", "http://127.0.0.1:1/metrics")
    st = WatchState([spec], cap_bins=600)
    lab = {"target": spec.target}
    seen: list[float] = []
    for i in range(40):
        t = i * BIN_NS + BIN_NS // 2
        v = 0.0 if i < 10 else 6.0 if i < 20 else 2.0
        seen.append(v)
        st.add(
            [
                TelemetrySample(t, SCRAPE_SOURCE, "scrape.ok", 1.0, lab),
                TelemetrySample(t, "llamacpp", "engine.running", v, lab),
            ]
        )
        st.advance(t)
    # bin b closes at the first tick t_i >= (b+1)·BIN + GRACE, i.e. i = b + 1 + GRACE/BIN,
    # rounded up past the half-bin offset: it holds the value scraped at that tick
    lag = math.ceil(((BIN_NS + GRACE_NS) - BIN_NS // 2) / BIN_NS)
    end = st.closed
    assert end == 40 - lag
    e = st.engines["e"]
    for k in (5, 10, 20, 30):
        want = sum(seen[b + lag] for b in range(end - k, end)) / k
        assert engine_figures(e, end, k).running_mean == pytest.approx(want)
    # by hand (lag 4, 36 bins closed): the last 30 bins hold ticks 10..39 (ten 6s, twenty 2s);
    # all 36 hold ticks 4..39 (six 0s, ten 6s, twenty 2s)
    assert lag == 4
    assert engine_figures(e, end, 30).running_mean == pytest.approx((10 * 6.0 + 20 * 2.0) / 30)
    assert engine_figures(e, end, 36).running_mean == pytest.approx((10 * 6.0 + 20 * 2.0) / 36)


@pytest.mark.parametrize(
    "value", ["7", "2.5", "1e999", "NaN", "x", "", "\t3", "3\t", "1}2", "-0", "4_0"]
)
def test_bucket_totals_with_the_memo_read_what_the_regex_reads(value: str) -> None:
    """One scrape learns the memo, a second with another value token reads through it: the same
    totals as without the memo (by hand for plain numbers: 3 label sets of one le summed)."""
    fam = "vllm:time_to_first_token_seconds"
    lines = [f'{fam}_bucket{{engine="{e}",le="0.1"}} {v}' for e, v in enumerate(["1", "2", "3"])]
    lines.append(f'{fam}_bucket{{le="+Inf"}}\t9')  # the value after a tab: never memoized
    memo: dict[str, tuple[str, float] | None] = {}
    assert bucket_totals(lines, {fam}, memo) == {fam: {0.1: 6.0, math.inf: 9.0}}
    assert len(memo) == 3
    again = [ln.rpartition(" ")[0] + " " + value if "0.1" in ln else ln for ln in lines]
    assert bucket_totals(again, {fam}, memo) == bucket_totals(again, {fam})
    if value in ("7", "-0"):
        assert bucket_totals(again, {fam}, memo)[fam][0.1] == 3 * float(value)


def test_closed_bins_histogram_rows_and_gpu_util_by_hand() -> None:
    """Bucket increments become cumulative rows (zeros where a bin got none), a new bound
    starts the ring again; a GPU's bin is its preferred source's mean, carried when empty."""
    spec = EngineSpec("e0", "http://127.0.0.1:9/metrics")
    st = WatchState([spec], 50)
    lab = {"target": spec.target}

    def bucket(b: int, le: str, v: float) -> TelemetrySample:
        t = b * BIN_NS + BIN_NS // 2
        return TelemetrySample(t, WATCH_SOURCE, "watch.ttft_bucket", v, {**lab, "le": le})

    def gpu(src: str, metric: str, v: float) -> TelemetrySample:
        return TelemetrySample(BIN_NS // 2, src, metric, v, {"gpu": "0"})

    st.add(
        [
            TelemetrySample(BIN_NS // 2, "scrape", "scrape.ok", 1.0, lab),
            bucket(0, "0.1", 2.0),
            bucket(0, "0.5", 3.0),
            bucket(0, "+Inf", 1.0),
            TelemetrySample(BIN_NS // 2, WATCH_SOURCE, "watch.ttft_sum", 1.25, lab),
            gpu("nvml", "gpu.busy_pct", 60.0),
            gpu("nvml", "gpu.busy_pct", 80.0),
            gpu("gpm", "gpu.sm_pct", 30.0),
            gpu("dcgm", "gpu.sm_pct", 50.0),  # gpm is preferred for SM activity
        ]
    )
    assert st.advance(2 * BIN_NS + GRACE_NS) == 2  # bins 0 and 1 closed
    h = st.engines["e0"].hist["ttft"]
    assert h.les == [0.1, 0.5, math.inf]
    assert h.ring.a[0].tolist() == [2.0, 5.0, 6.0]  # 2, 2 + 3, 2 + 3 + 1
    assert h.ring.a[1].tolist() == [0.0, 0.0, 0.0]
    assert (h.sum.a[0], h.sum.a[1]) == (1.25, 0.0)
    g = st.gpus["0"]
    assert (g.rings["gpu.busy_pct"].a[0], g.rings["gpu.sm_pct"].a[0]) == (70.0, 30.0)
    assert math.isnan(g.rings["gpu.dram_bw_pct"].a[0])
    assert g.util_source == "gpm:gpu.sm_pct"
    assert g.rings["util"].a[:2].tolist() == [30.0, 30.0]  # bin 1: carried over
    assert g.rings["gpu.busy_pct"].a[1] == 70.0
    st.add([bucket(2, "0.25", 4.0)])  # a bound not seen before: a new ring, bounds merged
    st.advance(3 * BIN_NS + GRACE_NS)
    h2 = st.engines["e0"].hist["ttft"]
    assert h2 is not h and h2.les == [0.1, 0.25, 0.5, math.inf]
    assert h2.ring.a[2].tolist() == [0.0, 4.0, 4.0, 4.0]
    assert np.isnan(h2.ring.a[0]).all()


@pytest.mark.parametrize("every_bins", [1, 10, 25])
def test_token_rates_divide_by_the_time_the_increases_span(every_bins: int) -> None:
    """An engine that makes 1,000 decode tokens/s, scraped every `every_bins` bins (100 ms, 1 s,
    2.5 s: a slow engine answers late, and each increase spans its whole interval): the 5 s and
    10 s windows read 1,000 tokens/s whatever the interval, by hand: Σ increases / Σ the
    intervals they span. (Counting each scraped bin as 100 ms read 10x and 25x.)"""
    from phaselens.telemetry.scrape import SCRAPE_SOURCE
    from phaselens.watch.engines import EngineSpec
    from phaselens.watch.indicators import engine_figures

    spec = EngineSpec("e", "http://127.0.0.1:1/metrics")
    st = WatchState([spec], cap_bins=600)
    lab = {"target": spec.target}
    rate = 1000.0
    interval_s = every_bins * BIN_NS / 1e9
    for i in range(200):
        t = i * BIN_NS + BIN_NS // 2
        batch = []
        if i % every_bins == 0:
            batch.append(TelemetrySample(t, SCRAPE_SOURCE, "scrape.ok", 1.0, lab))
            if i > 0:  # the first scrape has no interval and no increase
                ms = interval_s * 1e3
                batch.append(TelemetrySample(t, SCRAPE_SOURCE, "scrape.interval_ms", ms, lab))
                inc = rate * interval_s
                batch.append(TelemetrySample(t, "vllm", "engine.decode_tokens", inc, lab))
        st.add(batch)
        st.advance(t)
    e = st.engines["e"]
    end = st.closed
    for k in (50, 100):  # 5 s and 10 s: whole multiples of every interval
        # the window's last closed bins end on a scrape at most every_bins - 1 bins before
        # `end`; what it holds is n increases of rate x interval over n intervals
        got = engine_figures(e, end, k).generation_tps
        assert got == pytest.approx(rate, rel=0.01), (every_bins, k, got)
