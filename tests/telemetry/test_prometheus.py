"""Parser and interval samples on real engine scrapes (vLLM, llama.cpp) and on dcgm-exporter and
SGLang text written from their documented formats. Expected values are read off the text."""

from __future__ import annotations

from pathlib import Path

import pytest

from phaselens.telemetry.prometheus import (
    DCGM_KEEP,
    ENGINE_KEEP,
    Scrape,
    detect_source,
    interval_samples,
    parse_prometheus,
)
from phaselens.types import TelemetrySample

# vllm-/llama-metrics-sample.txt: real scrapes (vLLM CPU build, llama-server), copied from
# shared/reference/realengine/logs; dcgm-exporter.txt and sglang.txt: written from the formats.
FIX = Path(__file__).parent / "fixtures"


def _text(name: str) -> str:
    return (FIX / name).read_text()


def _one(samples: list[TelemetrySample], metric: str, **labels: str) -> TelemetrySample:
    hits = [
        s
        for s in samples
        if s.metric == metric and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(hits) == 1, (metric, labels, hits)
    return hits[0]


def test_llamacpp_real_sample_counters_keep_printed_names() -> None:
    fams = parse_prometheus(_text("llama-metrics-sample.txt"), ENGINE_KEEP)
    assert fams["llamacpp:prompt_tokens_total"].samples[0].value == 662
    assert fams["llamacpp:tokens_predicted_total"].samples[0].value == 1093
    assert fams["llamacpp:n_busy_slots_per_decode"].type == "gauge"
    assert fams["llamacpp:n_busy_slots_per_decode"].samples[0].value == pytest.approx(8.15672)
    # The _total gotcha: a counter printed without _total must not gain one.
    assert "llamacpp:n_tokens_max_total" not in fams
    assert fams["llamacpp:n_tokens_max"].type == "counter"
    assert fams["llamacpp:n_tokens_max"].samples[0].name == "llamacpp:n_tokens_max"
    assert detect_source(fams) == "llamacpp"


def test_vllm_real_sample_filters_and_histograms() -> None:
    text = _text("vllm-metrics-sample.txt")
    fams = parse_prometheus(text, ENGINE_KEEP, buckets=False)
    assert all(name.startswith("vllm:") for name in fams)  # python_*, process_*, http_* dropped
    assert not any(
        s.name.endswith(("_created", "_bucket")) for f in fams.values() for s in f.samples
    )
    gen = fams["vllm:generation_tokens_total"]
    assert gen.type == "counter"
    assert gen.samples[0].value == 1679
    assert gen.samples[0].labels == {"engine": "0", "model_name": "tiny-llama"}
    it = fams["vllm:iteration_tokens_total"]  # a histogram whose name ends in _total
    assert it.type == "histogram"
    by_name = {s.name: s.value for s in it.samples}
    assert by_name == {
        "vllm:iteration_tokens_total_count": 273,
        "vllm:iteration_tokens_total_sum": 2774,
    }
    success = {
        s.labels["finished_reason"]: s.value for s in fams["vllm:request_success_total"].samples
    }
    assert success["length"] == 29
    # Everything kept: buckets and non-engine families come back without the filters.
    full = parse_prometheus(text)
    assert "python_gc_objects_collected_total" in full
    assert any(s.name.endswith("_bucket") for s in full["vllm:time_to_first_token_seconds"].samples)
    assert detect_source(fams) == "vllm"


def _bump(text: str, changes: dict[str, str]) -> str:
    for old, new in changes.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


def test_llamacpp_two_scrapes_give_increases_gauges_and_canonical() -> None:
    t1 = _text("llama-metrics-sample.txt")
    t2 = _bump(
        t1,
        {
            "llamacpp:prompt_tokens_total 662": "llamacpp:prompt_tokens_total 700",
            "llamacpp:tokens_predicted_total 1093": "llamacpp:tokens_predicted_total 1193",
            "llamacpp:requests_processing 0": "llamacpp:requests_processing 4",
            "llamacpp:n_tokens_max 104": "llamacpp:n_tokens_max 130",
        },
    )
    a = Scrape(1_000_000_000, parse_prometheus(t1, ENGINE_KEEP))
    b = Scrape(1_100_000_000, parse_prometheus(t2, ENGINE_KEEP))
    out = interval_samples(a, b, extra_labels={"target": "http://x/metrics"})
    assert {s.t_ns for s in out} == {1_100_000_000}
    assert {s.source for s in out} == {"llamacpp"}
    assert _one(out, "llamacpp:prompt_tokens_total").value == 38
    assert _one(out, "llamacpp:tokens_predicted_total").value == 100
    assert _one(out, "llamacpp:n_tokens_max").value == 26
    assert _one(out, "llamacpp:n_decode_total").value == 0
    assert _one(out, "llamacpp:requests_processing").value == 4
    assert _one(out, "engine.prefill_tokens").value == 38
    assert _one(out, "engine.decode_tokens").value == 100
    running = _one(out, "engine.running")
    assert running.value == 4
    assert running.labels == {"engine": "llamacpp", "target": "http://x/metrics"}
    assert _one(out, "llamacpp:requests_processing").labels == {"target": "http://x/metrics"}


def test_first_scrape_has_gauges_only_and_info_once() -> None:
    fams = parse_prometheus(_text("vllm-metrics-sample.txt"), ENGINE_KEEP, buckets=False)
    first = interval_samples(None, Scrape(5, fams))
    metrics = {s.metric for s in first}
    assert "vllm:num_requests_running" in metrics
    assert "vllm:cache_config_info" in metrics
    assert "vllm:generation_tokens_total" not in metrics  # a counter needs two scrapes
    assert "engine.decode_tokens" not in metrics
    second = interval_samples(Scrape(5, fams), Scrape(10, fams))
    assert "vllm:cache_config_info" not in {s.metric for s in second}
    assert _one(second, "vllm:generation_tokens_total").value == 0
    assert _one(second, "vllm:iteration_tokens_total_count").value == 0


def test_vllm_canonical_labels_and_kv_scale() -> None:
    t1 = _text("vllm-metrics-sample.txt")
    t2 = _bump(
        t1,
        {
            'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.0': (
                'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.375'
            ),
            'vllm:generation_tokens_total{engine="0",model_name="tiny-llama"} 1679.0': (
                'vllm:generation_tokens_total{engine="0",model_name="tiny-llama"} 1779.0'
            ),
            'vllm:iteration_tokens_total_count{engine="0",model_name="tiny-llama"} 273.0': (
                'vllm:iteration_tokens_total_count{engine="0",model_name="tiny-llama"} 283.0'
            ),
            'vllm:iteration_tokens_total_sum{engine="0",model_name="tiny-llama"} 2774.0': (
                'vllm:iteration_tokens_total_sum{engine="0",model_name="tiny-llama"} 2954.0'
            ),
        },
    )
    a = Scrape(0, parse_prometheus(t1, ENGINE_KEEP, buckets=False))
    b = Scrape(100, parse_prometheus(t2, ENGINE_KEEP, buckets=False))
    out = interval_samples(a, b)
    kv = _one(out, "engine.kv_usage_pct")
    assert kv.value == pytest.approx(37.5)
    assert kv.labels == {"engine": "vllm", "engine_index": "0", "model": "tiny-llama"}
    assert _one(out, "engine.decode_tokens").value == 100
    # per-interval mean tokens per engine step = sum delta / count delta = 180 / 10
    n = _one(out, "vllm:iteration_tokens_total_count").value
    s = _one(out, "vllm:iteration_tokens_total_sum").value
    assert (n, s) == (10, 180)
    assert _one(out, "vllm:kv_cache_usage_perc").labels == {
        "engine": "0",
        "model_name": "tiny-llama",
    }


def test_counter_restart_and_new_series() -> None:
    before = (
        '# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{model_name="m"} 500\n'
    )
    after = (
        "# TYPE vllm:prompt_tokens_total counter\n"
        'vllm:prompt_tokens_total{model_name="m"} 30\n'
        'vllm:prompt_tokens_total{model_name="n"} 7\n'
    )
    out = interval_samples(Scrape(0, parse_prometheus(before)), Scrape(1, parse_prometheus(after)))
    assert _one(out, "vllm:prompt_tokens_total", model_name="m").value == 30  # restarted
    assert _one(out, "vllm:prompt_tokens_total", model_name="n").value == 7  # born in interval
    assert _one(out, "engine.prefill_tokens", model="n").value == 7


def test_sglang_fixture() -> None:
    t1 = _text("sglang.txt")
    m = '{model_name="meta-llama/Llama-3.1-8B-Instruct"}'
    t2 = _bump(
        t1,
        {
            f"sglang:generation_tokens_total{m} 7.557572e+06": (
                f"sglang:generation_tokens_total{m} 7557772"
            ),
            f"sglang:time_to_first_token_seconds_sum{m} 2.3518979474117756e+06": (
                f"sglang:time_to_first_token_seconds_sum{m} 2351898.9474117756"
            ),
            f"sglang:time_to_first_token_seconds_count{m} 320000.0": (
                f"sglang:time_to_first_token_seconds_count{m} 320004.0"
            ),
        },
    )
    fa = parse_prometheus(t1, ENGINE_KEEP, buckets=False)
    assert "python_gc_objects_collected_total" not in fa
    assert detect_source(fa) == "sglang"
    out = interval_samples(Scrape(0, fa), Scrape(1, parse_prometheus(t2, ENGINE_KEEP, False)))
    model = "meta-llama/Llama-3.1-8B-Instruct"
    assert _one(out, "engine.running").value == 12
    assert _one(out, "engine.waiting").value == 3
    assert _one(out, "engine.kv_usage_pct").value == pytest.approx(28.0)
    assert _one(out, "engine.decode_tokens").value == 200
    assert _one(out, "engine.prefill_tokens").value == 0
    assert _one(out, "engine.running").labels["model"] == model
    assert _one(out, "engine.running").labels["tp_rank"] == "0"
    # 4 first tokens with 1.0 s of TTFT between them: mean 0.25 s in the interval
    c = _one(out, "sglang:time_to_first_token_seconds_count").value
    s = _one(out, "sglang:time_to_first_token_seconds_sum").value
    assert c == 4
    assert s / c == pytest.approx(0.25, rel=1e-6)
    modes = {x.labels["mode"]: x.value for x in out if x.metric == "sglang:realtime_tokens_total"}
    assert modes == {"prefill_compute": 0, "prefill_cache": 0, "decode": 0}


def test_dcgm_fixture_ratios_labels_and_energy() -> None:
    t1 = _text("dcgm-exporter.txt")
    t2 = t1.replace("} 123456789", "} 123506789")  # +50,000 mJ
    fa = parse_prometheus(t1, DCGM_KEEP)
    fb = parse_prometheus(t2, DCGM_KEEP)
    assert detect_source(fa) == "dcgm"
    a, b = Scrape(0, fa), Scrape(100, fb)
    out = interval_samples(a, b, "dcgm", baseline=a)
    busy = [s for s in out if s.metric == "gpu.busy_pct"]
    # GR_ENGINE_ACTIVE (0.912345, printed for gpu 0 only) is in the scrape, so GPU_UTIL is not
    # used for any GPU: one busy value per source of truth, never two that disagree.
    assert [(s.labels["gpu"], round(s.value, 4)) for s in busy] == [("0", 91.2345)]
    g0 = _one(out, "gpu.dram_bw_pct", gpu="0")
    assert g0.value == pytest.approx(87.0)
    assert g0.labels["hostname"] == "dcgm-exporter-sn5rp"  # lower-cased from Hostname
    assert g0.labels["modelname"] == "NVIDIA H100 80GB HBM3"
    assert _one(out, "gpu.tensor_pct", gpu="0").value == pytest.approx(25.0)
    assert _one(out, "gpu.sm_clock_mhz", gpu="1").value == 1410
    assert _one(out, "gpu.power_w", gpu="0").value == pytest.approx(612.25)
    assert _one(out, "gpu.mem_used_bytes", gpu="0").value == 71234 * 1024 * 1024
    assert _one(out, "gpu.energy_j", gpu="0").value == pytest.approx(50.0)
    raw = _one(out, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
    assert raw.value == 50_000  # the counter's increase in the interval, raw mJ
    assert raw.labels["Hostname"] == "dcgm-exporter-sn5rp"  # raw labels kept as printed
    assert {s.source for s in out} == {"dcgm"}


def test_dcgm_gpu_util_used_without_profiling_fields() -> None:
    text = "\n".join(
        line for line in _text("dcgm-exporter.txt").splitlines() if "GR_ENGINE_ACTIVE" not in line
    )
    out = interval_samples(None, Scrape(0, parse_prometheus(text, DCGM_KEEP)), "dcgm")
    busy = {s.labels["gpu"]: s.value for s in out if s.metric == "gpu.busy_pct"}
    assert busy == {"0": 97, "1": 0}


@pytest.mark.parametrize(
    "garbage",
    [
        "<html><body>502 Bad Gateway</body></html>",
        'vllm:num_requests_running{engine="0" 1\n',
        "vllm:num_requests_running not-a-number\n",
    ],
)
def test_garbage_raises_value_error(garbage: str) -> None:
    with pytest.raises(ValueError):
        parse_prometheus(garbage)


def test_tgi_fixture_gauges_and_per_method_histograms() -> None:
    t1 = _text("tgi.txt")
    t2 = _bump(
        t1,
        {
            'tgi_batch_forward_duration_sum{method="decode"} 8.0': (
                'tgi_batch_forward_duration_sum{method="decode"} 8.9'
            ),
            'tgi_batch_forward_duration_count{method="decode"} 1000': (
                'tgi_batch_forward_duration_count{method="decode"} 1030'
            ),
            "tgi_queue_size 2": "tgi_queue_size 0",
        },
    )
    a = Scrape(0, parse_prometheus(t1, ENGINE_KEEP, buckets=False))
    out = interval_samples(a, Scrape(1, parse_prometheus(t2, ENGINE_KEEP, buckets=False)))
    assert {s.source for s in out} == {"tgi"}
    assert _one(out, "engine.running").value == 5
    assert _one(out, "engine.waiting").value == 0
    # 30 decode steps took 0.9 s in the interval: 30 ms per step
    n = _one(out, "tgi_batch_forward_duration_count", method="decode").value
    s = _one(out, "tgi_batch_forward_duration_sum", method="decode").value
    assert n == 30
    assert s / n == pytest.approx(0.03)
    assert _one(out, "tgi_batch_forward_duration_count", method="prefill").value == 0
