"""The watch's 100 ms bins: samples as they arrive, closed bins kept in fixed-size rings.

Why rings of numpy arrays: the watch runs for days, so memory must not grow, and every
indicator is a reduction over the last N bins (10 s = 100 bins, 5 min = 3000), which numpy does
in microseconds. A bin closes `GRACE_NS` after its end, so late samples (NVML's buffer, a
scrape's midpoint stamp) still land in it; a counter increase that arrives later still goes to
the oldest open bin (never lost); a late gauge reading is dropped.

Bin placement is analysis' (`analysis/bins.py`): a sample stamped t lands in the bin containing
t − 1 ns. The label of a bin is analysis' rule without steps (`labels.token_labels`): from the
prefill and decode tokens the engine counted in it. A bin no scrape of the engine landed in has
no label for that engine (unknown, not idle); the deployment's label (for the GPUs) is that of
all engines' tokens together, as analysis' lane "all".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import accumulate

import numpy as np

from phaselens.analysis.bins import GPU_SOURCE_PREFERENCE
from phaselens.analysis.findings.kv import PREFIX_HITS, PREFIX_QUERIES
from phaselens.analysis.labels import LABELS, token_labels
from phaselens.analysis.phases import UTIL_PREFERENCE
from phaselens.telemetry.scrape import SCRAPE_SOURCE
from phaselens.types import BIN_NS, F64, TelemetrySample
from phaselens.watch.engines import SGLANG_HIT_RATE, WATCH_SOURCE, EngineSpec

GRACE_NS = 300_000_000  # a bin closes this long after its end
GAUGE_STALE_NS = 2_000_000_000  # a gauge older than this is unknown (analysis: 2 s carry)
GPU_CARRY_BINS = 20  # a GPU reading is carried over at most this many empty bins (2 s)
NO_LABEL = -1
_CODE = {lab: i for i, lab in enumerate(LABELS)}
_COUNTERS = {"engine.prefill_tokens": "ptok", "engine.decode_tokens": "dtok"}
_GAUGES = {"engine.running": "sum", "engine.waiting": "sum", "engine.kv_usage_pct": "max"}
GPU_METRICS = ("gpu.busy_pct", "gpu.sm_pct", "gpu.dram_bw_pct")
_WANTED = frozenset(
    [*_COUNTERS, *_GAUGES, "engine.preemptions", *PREFIX_HITS, *PREFIX_QUERIES, SGLANG_HIT_RATE]
    + ["scrape.ok", "scrape.latency_ms", "scrape.interval_ms", "watch.restart", *GPU_METRICS]
    + [f"watch.{k}_{w}" for k in ("ttft", "itl") for w in ("bucket", "sum")]
)


class Ring:
    """The last `cap` closed bins of one series (NaN where unknown); `width` > 1: a row each."""

    def __init__(self, cap: int, width: int = 0) -> None:
        self.cap = cap
        self.a: F64 = np.full((cap, width) if width else cap, np.nan)

    def put(self, b: int, value: float | F64 | list[float]) -> None:
        self.a[b % self.cap] = value

    def last(self, end: int, k: int) -> F64:
        """Bins [end − k, end) in order (k ≤ cap), a copy: one or two slices of the ring."""
        i = (end - k) % self.cap
        j = i + k
        if j <= self.cap:
            out: F64 = self.a[i:j].copy()
        else:
            out = np.concatenate((self.a[i:], self.a[: j - self.cap]))
        return out


def labels_of(prefill: list[float], decode: list[float]) -> list[int]:
    """The label codes of bins from their tokens: one call of analysis' rule for them all."""
    _, _, lab = token_labels(np.array(prefill, dtype=np.float64), np.array(decode, np.float64))
    return [_CODE[str(x)] for x in lab]


@dataclass(slots=True)
class _Acc:
    """What arrived for one engine and one open bin."""

    scraped: bool = False
    span_s: float = 0.0  # the time the counter increases in `counts` span (scrape intervals)
    counts: dict[str, float] = field(default_factory=dict)
    hist: dict[str, dict[float, float]] = field(default_factory=dict)


class Hist:
    """Bucket increments per bin of one histogram: bounds fixed at first sight (a change of
    bounds, e.g. a restart with another build, starts the ring again)."""

    def __init__(self, cap: int, les: list[float]) -> None:
        self.les = sorted(les)
        self.bounds = frozenset(self.les)
        self.ring = Ring(cap, len(self.les))
        self.sum = Ring(cap)


class EngineState:
    """One engine: its rings, what is open, and its last scrape's state."""

    def __init__(self, spec: EngineSpec, cap: int) -> None:
        self.spec = spec
        self.cap = cap
        self.up: bool | None = None  # None: not tried yet
        self.latency_s: float | None = None
        self.last_ok_ns: int | None = None
        self.restarts = 0
        self.last_error = ""
        self.gauges: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        self.seen: set[str] = set()  # the metrics this engine has shown (absent vs 0)
        self.open: dict[int, _Acc] = {}
        self.rings = {k: Ring(cap) for k in _RING_NAMES}
        self.hist: dict[str, Hist] = {}
        self.phase_seconds = dict.fromkeys(LABELS, 0.0)

    def acc(self, b: int) -> _Acc:
        a = self.open.get(b)
        if a is None:
            a = self.open[b] = _Acc()
        return a

    def gauge(self, metric: str, now_ns: int) -> float:
        """The engine's current value (label sets summed, or their max): NaN when stale."""
        vals = self.gauges.get(metric)
        if not vals or self.last_ok_ns is None or now_ns - self.last_ok_ns > GAUGE_STALE_NS:
            return float("nan")
        how = _GAUGES.get(metric, "max")
        return float(sum(vals.values()) if how == "sum" else max(vals.values()))


_RING_NAMES = (
    "ptok",
    "dtok",
    "preempt",
    "hits",
    "queries",
    "running",
    "waiting",
    "kv",
    "sg_hit",
    "scraped",
    "span",
    "label",
)


class GpuState:
    """One GPU: per open bin the (metric, source) readings; rings of the chosen sources."""

    def __init__(self, gpu: str, cap: int) -> None:
        self.gpu = gpu
        self.open: dict[int, dict[tuple[str, str], list[float]]] = {}
        self.rings = {m: Ring(cap) for m in (*GPU_METRICS, "util")}
        self.carry: dict[str, tuple[float, int]] = {}
        self.util_rank = len(UTIL_PREFERENCE)  # best utilization source seen so far
        self.util_source: str | None = None


class WatchState:
    """Every engine and GPU; `add` takes sampler batches, `advance` closes due bins."""

    def __init__(self, engines: Iterable[EngineSpec], cap_bins: int) -> None:
        self.cap = cap_bins
        self.engines = {e.name: EngineState(e, cap_bins) for e in engines}
        self._by_target = {e.spec.target: e for e in self.engines.values()}
        self.gpus: dict[str, GpuState] = {}
        self.closed = 0  # bins [0, closed) are closed
        self.label = Ring(cap_bins)  # the deployment's label per bin (all engines' tokens)
        self.closed_bins: list[tuple[int, dict[str, int], int]] = []  # since the last take

    # --- arriving samples -------------------------------------------------------------------
    def add(self, samples: Iterable[TelemetrySample]) -> None:
        for s in samples:
            if s.metric not in _WANTED:
                continue  # a raw name the watch does not read (it still goes to --record)
            b = max(int((s.t_ns - 1) // BIN_NS), 0)
            target = s.labels.get("target")
            eng = self._by_target.get(target) if target is not None else None
            if eng is not None:
                self._engine_sample(eng, s, b)
            elif "gpu" in s.labels and s.metric in GPU_METRICS:
                self._gpu_sample(s, b)

    def _engine_sample(self, e: EngineState, s: TelemetrySample, b: int) -> None:
        m = s.metric
        late = b < self.closed
        if s.source == SCRAPE_SOURCE:
            if m == "scrape.ok":
                e.up = s.value > 0
                if e.up:
                    e.last_ok_ns = s.t_ns if e.last_ok_ns is None else max(e.last_ok_ns, s.t_ns)
                    if not late:
                        e.acc(b).scraped = True
                else:
                    e.last_error = e.last_error or "no answer"
            elif m == "scrape.interval_ms":  # with the counter increases: where they go
                e.acc(max(b, self.closed)).span_s += s.value / 1e3
            elif m == "scrape.latency_ms":
                e.latency_s = s.value / 1e3
            return
        if s.source == "dcgm" or (s.source != WATCH_SOURCE and "gpu" in s.labels):
            if m in GPU_METRICS:
                self._gpu_sample(s, b)
            return
        b = max(b, self.closed)  # a late increase goes to the oldest open bin
        if s.source == WATCH_SOURCE:
            if m == "watch.restart":
                e.restarts += 1
                return
            kind, _, what = m.removeprefix("watch.").partition("_")
            if what == "bucket":
                le = float(s.labels.get("le", "nan"))
                h = e.acc(b).hist.setdefault(kind, {})
                h[le] = h.get(le, 0.0) + s.value
            elif what == "sum":
                key = f"{kind}_sum"
                c = e.acc(b).counts
                c[key] = c.get(key, 0.0) + s.value
            e.seen.add(kind)
            return
        if m in _COUNTERS or m == "engine.preemptions":
            key = _COUNTERS.get(m, "preempt")
        elif m in PREFIX_HITS:
            key = "hits"
        elif m in PREFIX_QUERIES:
            key = "queries"
        elif m in _GAUGES or m == SGLANG_HIT_RATE:
            e.gauges.setdefault(m, {})[tuple(sorted(s.labels.items()))] = s.value
            e.seen.add(m)
            return
        else:
            return
        e.seen.add(key)
        c = e.acc(b).counts
        c[key] = c.get(key, 0.0) + s.value

    def _gpu_sample(self, s: TelemetrySample, b: int) -> None:
        if b < self.closed:
            return  # a late GPU reading: its bin is closed
        gpu = str(s.labels["gpu"])
        g = self.gpus.get(gpu)
        if g is None:
            g = self.gpus[gpu] = GpuState(gpu, self.cap)
        acc = g.open.setdefault(b, {}).setdefault((s.metric, s.source), [0.0, 0.0])
        acc[0] += s.value
        acc[1] += 1.0

    # --- closing bins -----------------------------------------------------------------------
    def advance(self, now_ns: int) -> int:
        """Close every bin whose end is GRACE_NS or more in the past; the number closed."""
        n = 0
        while (self.closed + 1) * BIN_NS + GRACE_NS <= now_ns:
            self._close(self.closed, now_ns)
            self.closed += 1
            n += 1
        return n

    def _close(self, b: int, now_ns: int) -> None:
        tokens: dict[str, tuple[float, float]] = {}  # engines whose bin has a label
        for name, e in self.engines.items():
            a = e.open.pop(b, None) or _Acc()
            r = e.rings
            c = a.counts
            scraped = a.scraped or bool(c)
            r["scraped"].put(b, 1.0 if scraped else 0.0)
            r["span"].put(b, a.span_s)
            for key in ("ptok", "dtok", "preempt", "hits", "queries"):
                r[key].put(b, c.get(key, 0.0) if scraped and key in e.seen else np.nan)
            r["running"].put(b, e.gauge("engine.running", now_ns))
            r["waiting"].put(b, e.gauge("engine.waiting", now_ns))
            r["kv"].put(b, e.gauge("engine.kv_usage_pct", now_ns))
            r["sg_hit"].put(b, e.gauge(SGLANG_HIT_RATE, now_ns))
            if scraped and "ptok" in e.seen and "dtok" in e.seen:
                tokens[name] = (c.get("ptok", 0.0), c.get("dtok", 0.0))
            self._close_hist(e, a, b)
        ps = [p for p, _ in tokens.values()]
        ds = [d for _, d in tokens.values()]
        codes = labels_of([*ps, sum(ps)], [*ds, sum(ds)]) if tokens else []
        labelled = dict(zip(tokens, codes, strict=False))  # codes[-1]: the total's
        per_engine: dict[str, int] = {}
        for name, e in self.engines.items():
            code = labelled.get(name, NO_LABEL)
            if code != NO_LABEL:
                e.phase_seconds[LABELS[code]] += BIN_NS / 1e9
            e.rings["label"].put(b, float(code))
            per_engine[name] = code
        code_all = codes[-1] if tokens else NO_LABEL  # all engines' tokens together
        self.label.put(b, float(code_all))
        for g in self.gpus.values():
            self._close_gpu(g, b)
        self.closed_bins.append((b, per_engine, code_all))

    def _close_hist(self, e: EngineState, a: _Acc, b: int) -> None:
        for kind in ("ttft", "itl"):
            inc = a.hist.get(kind)
            h = e.hist.get(kind)
            if inc and (h is None or not h.bounds.issuperset(inc)):
                h = e.hist[kind] = Hist(self.cap, list(set(inc) | set(h.les if h else [])))
            if h is None:
                continue
            # cumulative again; `accumulate` adds in order as np.cumsum does (equal floats), at
            # a tenth of its cost on a ~20-element list; no increments: a row of zeros
            h.ring.put(b, list(accumulate([inc.get(le, 0.0) for le in h.les])) if inc else 0.0)
            h.sum.put(b, a.counts.get(f"{kind}_sum", 0.0))

    def _close_gpu(self, g: GpuState, b: int) -> None:
        by_metric: dict[str, dict[str, list[float]]] = {}  # metric -> source -> [sum, n]
        for (m, src), v in g.open.pop(b, {}).items():
            by_metric.setdefault(m, {})[src] = v
        for metric in GPU_METRICS:
            srcs = by_metric.get(metric, {})
            val = float("nan")
            if srcs:
                order = [s for s in GPU_SOURCE_PREFERENCE.get(metric, ()) if s in srcs]
                best = (order or sorted(srcs))[0]
                val = srcs[best][0] / srcs[best][1]
                g.carry[metric] = (val, b)
            elif metric in g.carry and b - g.carry[metric][1] <= GPU_CARRY_BINS:
                val = g.carry[metric][0]
            g.rings[metric].put(b, val)
            for rank, (src, m) in enumerate(UTIL_PREFERENCE):
                if m == metric and src in srcs and rank < g.util_rank:
                    g.util_rank, g.util_source = rank, f"{src}:{m}"
        if g.util_source is not None:
            metric = g.util_source.partition(":")[2]
            g.rings["util"].put(b, g.rings[metric].a[b % self.cap])
        else:
            g.rings["util"].put(b, np.nan)

    def take_closed(self) -> list[tuple[int, dict[str, int], int]]:
        """Bins closed since the last call: (bin, engine -> label code, deployment label)."""
        out, self.closed_bins = self.closed_bins, []
        return out
