"""The watched engines: `--engine [NAME=]URL` parsed, and each one's /metrics scraped with its
latency histograms' buckets and its restarts.

Why a wrapper around `ScrapeSource` and not a new scraper: the sampler's scrape is the one that
turns engine text into the canonical samples a run stores (docs/run-format.md), and the watch
records the same samples. What the watch needs beyond them comes from the same parsed scrape:
the bucket increments of the TTFT and ITL histograms (for live quantiles) and counter resets (an
engine that restarted), emitted as `watch.*` samples beside the others.
"""

from __future__ import annotations

import math
import re
import urllib.parse
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from phaselens.analysis.findings.kv import PREFIX_HITS, PREFIX_QUERIES
from phaselens.errors import InputError
from phaselens.inputs.redact import redact_url
from phaselens.inputs.urls import check_url
from phaselens.telemetry.clock import RunClock
from phaselens.telemetry.prometheus import CANONICAL, Scrape
from phaselens.telemetry.scrape import ScrapeSource, metrics_url
from phaselens.types import TelemetrySample

WATCH_SOURCE = "watch"
# Latency histograms, best first per engine: kind -> printed family names (seconds).
HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft": (
        "vllm:time_to_first_token_seconds",
        "sglang:time_to_first_token_seconds",
    ),
    "itl": (
        "vllm:inter_token_latency_seconds",
        "vllm:time_per_output_token_seconds",  # older vLLM: the same per-token gap
        "sglang:inter_token_latency_seconds",
        "sglang:time_per_output_token_seconds",
    ),
}
SGLANG_HIT_RATE = "sglang:cache_hit_rate"
# Families the watch parses: those with a canonical name (counters by their printed `_total`
# name, as in their TYPE line), the prefix-cache counters and the histograms (their _count and
# _sum; buckets are read apart, `bucket_totals`): a narrow `keep`, as prometheus-client's
# parser costs ~60 µs a line.
WATCH_KEEP: tuple[str, ...] = tuple(
    dict.fromkeys(
        [n for n in CANONICAL if not n.startswith("DCGM_")]
        + [n for n in PREFIX_HITS + PREFIX_QUERIES if not n.endswith("_total")]
        + [SGLANG_HIT_RATE]
        + [n for names in HISTOGRAMS.values() for n in names]
    )
)


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """One `--engine`: its short name (the `engine` label) and its /metrics URL."""

    name: str
    url: str

    @property
    def target(self) -> str:
        """The `target` label its scrape samples carry (the URL, redacted)."""
        return redact_url(self.url)


def parse_engines(values: Sequence[str]) -> tuple[EngineSpec, ...]:
    """`[NAME=]URL` each; URL an engine base (`http://h:p` or `/v1`) or its /metrics. The name
    defaults to host:port; names must be distinct. Bad input: InputError."""
    out: list[EngineSpec] = []
    for v in values:
        name, eq, url = v.partition("=")
        if not eq or "://" in name:
            name, url = "", v
        url = url.strip()
        u = urllib.parse.urlsplit(check_url(url, "--engine"))
        murl = url if u.path.rstrip("/").endswith("/metrics") else metrics_url(url)
        name = name.strip() or (u.netloc.rpartition("@")[2])
        if not name or any(c in name for c in '"\\\n{}'):
            raise InputError(f"--engine: bad engine name {name[:40]!r}")
        out.append(EngineSpec(name, murl))
    names = [e.name for e in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InputError(f"--engine: the name {dup[0]!r} is given twice (use NAME=URL)")
    if not out:
        raise InputError("--engine: at least one engine URL is needed")
    return tuple(out)


_BUCKET = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)_bucket\{(.*)\}[ \t]+([^ \t]+)")
_LE = re.compile(r'(?:^|,)\s*le\s*=\s*"([^"]*)"')


def _bucket_of(m: re.Match[str] | None, families: Collection[str]) -> tuple[str, float] | None:
    """(family, le) of a `<family>_bucket{...,le="x"} value` line of one of `families`."""
    le = _LE.search(m[2]) if m else None
    if m is None or le is None or m[1] not in families:
        return None
    try:
        return m[1], float(le[1])
    except ValueError:
        return None


_UNSEEN = ("", math.nan)
MAX_MEMO = 4096  # bucket lines remembered per engine (vLLM prints ~40 of the two families)


def bucket_totals(
    lines: Iterable[str],
    families: Collection[str],
    memo: dict[str, tuple[str, float] | None] | None = None,
) -> dict[str, dict[float, float]]:
    """family -> le -> cumulative count (label sets summed), from the scrape's bucket lines
    (`Parsed.buckets`: what the line check set aside, unparsed).

    Why not through the parser: buckets are most of a histogram's lines, and prometheus-client
    costs ~60 µs a line; only `<family>_bucket{...,le="x"} value` lines of these families are
    read here (a line that does not fit is ignored; the family's _count/_sum still parse).
    `memo` (one per engine and `families`): (family, le) by the line up to its value, read by
    the regex once, as an engine prints the same bucket lines every scrape."""
    out: dict[str, dict[float, float]] = {}
    for line in lines:
        head, _, token = line.rpartition(" ")
        where = _UNSEEN if memo is None else memo.get(head, _UNSEEN)
        if where is _UNSEEN:
            m = _BUCKET.fullmatch(line.rstrip())
            where = _bucket_of(m, families)
            if m is None:
                continue
            if memo is not None and m.start(3) == len(head) + 1 and m.end(3) == len(line):
                if len(memo) >= MAX_MEMO:
                    memo.clear()
                memo[head] = where  # the value is the last token: the rest fixes (family, le)
            token = m[3]
        if where is None:
            continue
        try:
            value = float(token)
        except ValueError:
            continue
        if not math.isfinite(value):
            continue
        fam = out.setdefault(where[0], {})
        fam[where[1]] = fam.get(where[1], 0.0) + value
    return out


def _sum_of(scrape: Scrape | None, family: str) -> float | None:
    fam = scrape.families.get(family) if scrape is not None else None
    if fam is None:
        return None
    vals = [s.value for s in fam.samples if s.name.endswith("_sum")]
    return sum(vals) if vals else None


def counter_reset(prev: Scrape, cur: Scrape) -> bool:
    """Did any counter (or histogram count) go down: the engine restarted between the two."""
    before = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in prev.families.values()
        if f.type in ("counter", "histogram")
        for s in f.samples
        if f.type == "counter" or s.name.endswith("_count")
    }
    for f in cur.families.values():
        if f.type not in ("counter", "histogram"):
            continue
        for s in f.samples:
            if f.type == "histogram" and not s.name.endswith("_count"):
                continue
            old = before.get((s.name, tuple(sorted(s.labels.items()))))
            if old is not None and s.value < old:
                return True
    return False


def histogram_increments(
    prev: Mapping[float, float] | None,
    cur: Mapping[float, float],
    prev_sum: float | None,
    cur_sum: float | None,
) -> tuple[dict[float, float], float]:
    """(le -> increase of the cumulative count, increase of the sum) of one histogram between
    two scrapes; a decrease (a restart) counts from 0, as Prometheus' `increase()` does."""
    old = prev or {}
    reset = any(cur.get(le, 0.0) < v for le, v in old.items())
    inc = {le: (v if reset else v - old.get(le, 0.0)) for le, v in cur.items()}
    s_old = 0.0 if reset or prev_sum is None else prev_sum
    return inc, max((cur_sum or 0.0) - s_old, 0.0)


def pick_histograms(found: Mapping[str, Mapping[float, float]]) -> dict[str, str]:
    """kind -> the engine's best histogram family of that kind among those it printed."""
    out = {}
    for kind, names in HISTOGRAMS.items():
        best = next((n for n in names if found.get(n)), None)
        if best is not None:
            out[kind] = best
    return out


class WatchedEngine:
    """A `ScrapeSource` for one engine, plus `watch.*` samples: histogram increments per bucket
    (`watch.ttft_bucket` / `watch.itl_bucket`, label `le`: observations in (previous le, le];
    every bucket the first time, then only those that got some), their sums (`watch.*_sum`, seconds)
    and `watch.restart` (1 when counters went down since the last good scrape)."""

    def __init__(self, spec: EngineSpec, clock: RunClock, timeout_s: float) -> None:
        self.spec = spec
        self.inner = ScrapeSource(spec.url, "engine", clock, timeout_s, WATCH_KEEP, narrow=True)
        self.name = self.inner.name
        self._labels: Mapping[str, str] = {"target": spec.target}
        self._buckets: dict[str, dict[float, float]] = {}
        self._bounds: dict[str, list[float]] = {}
        self._families = frozenset(n for names in HISTOGRAMS.values() for n in names)
        self._bucket_memo: dict[str, tuple[str, float] | None] = {}

    def tick(self) -> list[TelemetrySample]:
        prev = self.inner.last
        out = self.inner.tick()
        cur = self.inner.last
        if cur is None or cur is prev:
            return out  # the scrape failed: scrape.ok 0 says so
        t = cur.t_ns
        if prev is not None and counter_reset(prev, cur):
            out.append(TelemetrySample(t, WATCH_SOURCE, "watch.restart", 1.0, self._labels))
        found = bucket_totals(self.inner.last_buckets, self._families, self._bucket_memo)
        before, self._buckets = self._buckets, found
        if prev is None:
            return out  # the first scrape is the baseline of every increase
        for kind, family in pick_histograms(found).items():
            inc, total = histogram_increments(
                before.get(family), found[family], _sum_of(prev, family), _sum_of(cur, family)
            )
            les = sorted(inc)
            every = self._bounds.get(kind) != les  # all bounds once (and when they change)
            self._bounds[kind] = les
            below = 0.0
            for le in les:  # per bucket, not cumulative: only the buckets that got some
                v, below = max(inc[le] - below, 0.0), max(inc[le], below)
                if v > 0 or every:
                    lab = {**self._labels, "le": repr(le) if le != math.inf else "+Inf"}
                    out.append(TelemetrySample(t, WATCH_SOURCE, f"watch.{kind}_bucket", v, lab))
            out.append(TelemetrySample(t, WATCH_SOURCE, f"watch.{kind}_sum", total, self._labels))
        return out

    def missed(self, t_ns: int) -> list[TelemetrySample]:
        return self.inner.missed(t_ns)

    def statuses(self) -> dict[str, str]:
        return self.inner.statuses()

    def close(self) -> None:
        self.inner.close()
