"""Prometheus text from engine `/metrics` and dcgm-exporter, turned into tidy interval samples.

Why pure functions: the sampler, the e2e tests and analysis all need the same answer to "what
happened between these two scrapes". `parse_prometheus` reads one scrape; `interval_samples`
turns two successive scrapes into samples: gauges as they are, counters as the increase in the
interval, histograms and summaries as the increase of their `_count` and `_sum` (buckets are
dropped: per-interval mean = sum delta / count delta). Raw metric names are kept exactly as the
server exposed them, and the canonical names of docs/run-format.md are added beside them.

The parser itself (text -> families, the line check, the shape cache) is `promtext.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from phaselens.telemetry.promtext import (
    COUNTERISH,
    Family,
    Parsed,
    PromSample,
    ShapeCache,
    parse_prometheus,
    parse_prometheus_counted,
)
from phaselens.types import TelemetrySample

__all__ = [  # the parser's names, for the callers that read both halves from here
    "Family",
    "Parsed",
    "PromSample",
    "ShapeCache",
    "parse_prometheus",
    "parse_prometheus_counted",
]

# Engine recognized by the prefix of its metric names; the value is the sample's `source`.
ENGINE_PREFIXES: dict[str, str] = {
    "vllm:": "vllm",
    "sglang:": "sglang",
    "tgi_": "tgi",
    "llamacpp:": "llamacpp",
}
DCGM_PREFIX = "DCGM_"
ENGINE_KEEP: tuple[str, ...] = tuple(ENGINE_PREFIXES)
DCGM_KEEP: tuple[str, ...] = (DCGM_PREFIX,)


@dataclass(frozen=True, slots=True)
class Scrape:
    """One successful scrape, stamped on the run clock (midpoint of request and response)."""

    t_ns: int
    families: Mapping[str, Family]


@dataclass(frozen=True, slots=True)
class Canonical:
    """How a raw sample maps onto a canonical name: value * scale, unless `unless` is present."""

    metric: str
    scale: float = 1.0
    unless: str = ""  # skip when this raw sample name is in the same scrape (a better source)


# Raw printed sample name -> canonical (docs/run-format.md). Counters are mapped after they
# were turned into per-interval increases, so `engine.prefill_tokens` is tokens in the interval.
CANONICAL: dict[str, Canonical] = {
    # vLLM
    "vllm:num_requests_running": Canonical("engine.running"),
    "vllm:num_requests_waiting": Canonical("engine.waiting"),
    "vllm:kv_cache_usage_perc": Canonical("engine.kv_usage_pct", 100.0),
    "vllm:gpu_cache_usage_perc": Canonical(
        "engine.kv_usage_pct", 100.0, "vllm:kv_cache_usage_perc"
    ),
    "vllm:prompt_tokens_total": Canonical("engine.prefill_tokens"),
    "vllm:generation_tokens_total": Canonical("engine.decode_tokens"),
    "vllm:num_preemptions_total": Canonical("engine.preemptions"),
    # SGLang (token_usage is a 0-1 fraction of the KV token pool)
    "sglang:num_running_reqs": Canonical("engine.running"),
    "sglang:num_queue_reqs": Canonical("engine.waiting"),
    "sglang:token_usage": Canonical("engine.kv_usage_pct", 100.0),
    "sglang:prompt_tokens_total": Canonical("engine.prefill_tokens"),
    "sglang:generation_tokens_total": Canonical("engine.decode_tokens"),
    # TGI (legacy)
    "tgi_batch_current_size": Canonical("engine.running"),
    "tgi_queue_size": Canonical("engine.waiting"),
    # llama.cpp
    "llamacpp:requests_processing": Canonical("engine.running"),
    "llamacpp:requests_deferred": Canonical("engine.waiting"),
    "llamacpp:kv_cache_usage_ratio": Canonical("engine.kv_usage_pct", 100.0),
    "llamacpp:prompt_tokens_total": Canonical("engine.prefill_tokens"),
    "llamacpp:tokens_predicted_total": Canonical("engine.decode_tokens"),
    # dcgm-exporter (PROF_* are 0-1 ratios; GR_ENGINE_ACTIVE is preferred over GPU_UTIL)
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": Canonical("gpu.busy_pct", 100.0),
    "DCGM_FI_DEV_GPU_UTIL": Canonical("gpu.busy_pct", 1.0, "DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
    "DCGM_FI_PROF_SM_ACTIVE": Canonical("gpu.sm_pct", 100.0),
    "DCGM_FI_PROF_SM_OCCUPANCY": Canonical("gpu.sm_occupancy_pct", 100.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": Canonical("gpu.tensor_pct", 100.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": Canonical("gpu.dram_bw_pct", 100.0),
    "DCGM_FI_DEV_MEM_COPY_UTIL": Canonical("gpu.mem_busy_pct"),
    "DCGM_FI_DEV_POWER_USAGE": Canonical("gpu.power_w"),
    "DCGM_FI_DEV_SM_CLOCK": Canonical("gpu.sm_clock_mhz"),
    "DCGM_FI_DEV_MEM_CLOCK": Canonical("gpu.mem_clock_mhz"),
    "DCGM_FI_DEV_FB_USED": Canonical("gpu.mem_used_bytes", 1024.0 * 1024.0),  # MiB
}
# Counters whose running total since the run start is the canonical value (needs a baseline).
SINCE_START: dict[str, Canonical] = {
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": Canonical("gpu.energy_j", 1e-3),  # mJ
}

_HISTOGRAMISH = {"histogram", "summary", "gaugehistogram"}


def detect_source(families: Mapping[str, Family]) -> str:
    """The engine that printed these families (by metric prefix), "dcgm", or "" if unknown."""
    for name in families:
        for prefix, kind in ENGINE_PREFIXES.items():
            if name.startswith(prefix):
                return kind
        if name.startswith(DCGM_PREFIX):
            return "dcgm"
    return ""


def _key(s: PromSample) -> tuple[str, tuple[tuple[str, str], ...]]:
    return s.name, tuple(sorted(s.labels.items()))


def _values(scrape: Scrape | None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    if scrape is None:
        return {}
    return {_key(s): s.value for f in scrape.families.values() for s in f.samples}


def _canonical_labels(
    labels: Mapping[str, str], source: str, extra: Mapping[str, str]
) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in labels.items():
        if source == "dcgm":
            out[k.lower()] = v  # dcgm-exporter renamed Hostname -> hostname: match either
        elif k == "model_name":
            out["model"] = v
        elif k == "engine":
            out["engine_index"] = v  # vLLM's data-parallel engine index
        else:
            out[k] = v
    if source != "dcgm":
        out["engine"] = source
    out.update(extra)
    return out


def interval_samples(
    prev: Scrape | None,
    cur: Scrape,
    source: str = "",
    extra_labels: Mapping[str, str] | None = None,
    baseline: Scrape | None = None,
) -> list[TelemetrySample]:
    """Samples for the interval (prev.t_ns, cur.t_ns], all stamped at cur.t_ns.

    Gauges (and untyped, info, summary quantiles): the value in `cur`. Counters and the `_count`
    / `_sum` of histograms and summaries: cur - prev per label set; a series missing from `prev`
    counts from 0 (born in the interval) and a decrease means a restart (the increase is then
    the value in `cur`, as Prometheus' `increase()` assumes). With `prev` None only gauges come
    out, and `*_info` gauges only come out then. Canonical names (CANONICAL) are added beside
    the raw ones; `baseline` (the run's first scrape) enables the since-start ones (energy).
    `extra_labels` (e.g. the target) go on every sample.
    """
    src = source or detect_source(cur.families) or "engine"
    extra = dict(extra_labels or {})
    before = _values(prev)
    printed = {s.name for f in cur.families.values() for s in f.samples}
    first = _values(baseline) if not printed.isdisjoint(SINCE_START) else {}
    raw: list[TelemetrySample] = []
    out: list[TelemetrySample] = []
    t = cur.t_ns
    for fam in cur.families.values():
        for s in fam.samples:
            is_total = fam.type in COUNTERISH or (
                fam.type in _HISTOGRAMISH and s.name.endswith(("_count", "_sum"))
            )
            if s.name.endswith("_bucket"):
                continue
            if prev is not None and not is_total and s.name.endswith("_info"):
                continue  # static info (vLLM's cache_config_info): once, on the first scrape
            value = s.value
            if is_total:
                if prev is None:
                    continue
                old = before.get(_key(s), 0.0)
                value = s.value - old if s.value >= old else s.value
            labels = {**s.labels, **extra}
            raw.append(TelemetrySample(t, src, s.name, value, labels))
            canon = CANONICAL.get(s.name)
            if canon is not None and not (canon.unless and canon.unless in printed):
                cl = _canonical_labels(s.labels, src, extra)
                out.append(TelemetrySample(t, src, canon.metric, value * canon.scale, cl))
            since = SINCE_START.get(s.name)
            if since is not None and _key(s) in first:
                cl = _canonical_labels(s.labels, src, extra)
                v = (s.value - first[_key(s)]) * since.scale
                out.append(TelemetrySample(t, src, since.metric, v, cl))
    return raw + out
