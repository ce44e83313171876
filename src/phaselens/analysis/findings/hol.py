"""The head-of-line-blocking rule: short requests wait behind long prefills (issue 30).

Evidence, at the same moments: the short requests are split by whether a long request's prefill
(its send to its first token, as the client sees it) was in flight in the 100 ms bin they arrived
in. Their TTFT p90 with long work in flight is set against their TTFT p90 without it, and
against what their own prompt length predicts (TTFT = a + b·input tokens, fitted by least
squares on every request that arrived with no long prefill in flight). Arrival bins, not the
whole wait, decide the split: a short request that waited longer would otherwise overlap more
long prefills only because it waited longer.

A second shape of the same blocking is a queue served in arrival order behind long-running
work (all slots held by long decodes: the prefill split above then sees every short request
wait alike). Its evidence, again at the same moments: each short request's TTFT against that of
the long request that arrived nearest to it (arrival order serves them alike, a priority serves
the short ones first), and the short class's TTFT against its own generation time (end − first
token: waiting, not its own work, makes its latency).

Short and long: the spec's classes with the smallest and largest mean prompt (when it named at
least two, and the largest is at least LENGTH_GAP times the smallest); in a run without classes,
the prompts up to the median length against those of at least LENGTH_MIX times the median (a run
without such prompts is not length-mixed: the rule stays quiet).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from phaselens.analysis.classes import named_classes
from phaselens.analysis.findings.base import Analysis, RuleResult, span
from phaselens.analysis.stats import fnum, interval_integral
from phaselens.types import BIN_NS, F64, Finding

HOL_RATIO = 2.0  # short TTFT p90 with a long prefill in flight / without it (and / predicted)
HOL_MIN_MS = 50.0  # ... and at least this much longer
MIN_SHORT = 20  # served short requests before the rule trusts a p90
MIN_SIDE = 5  # ... and at least this many on each side of the split
LENGTH_GAP = 2.0  # classes: the long class's mean prompt over the short class's
LENGTH_MIX = 4.0  # no classes: a prompt this many times the median length is long
SAME_WAIT = 0.5  # queued: short TTFT / TTFT of the long request arriving nearest, median
WAIT_OVER_WORK = 2.0  # ... and the short class's TTFT p50 over its own generation time p50
PAIR_GAP_NS = 10 * BIN_NS  # the farthest a paired long arrival may be (or its median gap)
MIN_PAIRS = 10  # paired short requests before the queued branch trusts its median


def _split(a: Analysis, f: pl.DataFrame) -> tuple[str, str, Any, Any] | None:
    """(short name, long name, short row mask, long row mask) over `f`, or None."""
    inp = f["input_tokens"].cast(pl.Float64).fill_null(0.0).to_numpy()
    if named_classes(a.manifest) and f["req_class"].n_unique() > 1:
        means = f.group_by("req_class").agg(pl.col("input_tokens").mean()).sort("input_tokens")
        short, long = str(means["req_class"][0]), str(means["req_class"][-1])
        lo, hi = float(means["input_tokens"][0]), float(means["input_tokens"][-1])
        if hi < LENGTH_GAP * max(lo, 1.0):
            return None
        cls = f["req_class"].to_numpy()
        return short, long, cls == short, cls == long
    if inp.size == 0:
        return None
    p50 = max(float(np.percentile(inp, 50)), 1.0)
    long = inp >= LENGTH_MIX * p50
    if not long.any():
        return None
    return "prompts up to the median", f"prompts of {LENGTH_MIX:g}x the median", inp <= p50, long


def _p90(x: F64) -> float | None:
    return float(np.percentile(x, 90)) if x.size else None


def _predicted(inp: F64, ttft: F64, clear: Any, short_busy: Any) -> float | None:
    """p90 of a + b·input over the short requests that arrived with a long prefill in flight,
    a and b fitted on the requests that arrived without one; None when the fit is not possible."""
    x, y = inp[clear], ttft[clear]
    if np.unique(x).size < 2:
        return None
    b, a0 = np.polyfit(x, y, 1)
    if b < 0:  # a longer prompt cannot be faster: the fit says nothing here
        return None
    return _p90(a0 + b * inp[short_busy])


def head_of_line(a: Analysis) -> RuleResult:
    f = a.rt.frame.filter(pl.col("sent_ns").is_not_null())
    parts = _split(a, f)
    if parts is None:
        return []
    short_name, long_name, is_short, is_long = parts
    ok = f["ok"].to_numpy().astype(bool) & f["first_token_ns"].is_not_null().to_numpy()
    n_short = int((ok & is_short).sum())
    if n_short < MIN_SHORT:
        return []
    sent = f["sent_ns"].cast(pl.Float64).to_numpy()
    first = f["first_token_ns"].cast(pl.Float64).fill_null(np.nan).to_numpy()
    end = f["end_ns"].cast(pl.Float64).fill_null(np.nan).to_numpy()
    # a long prefill runs from its send to its first token (or its end, if it never had one)
    lp_end = np.where(np.isnan(first), end, first)
    lmask = is_long & ~np.isnan(lp_end)
    sched = f["scheduled_ns"].to_numpy().astype(np.int64)
    n_bins = int(max(sched.max(), np.nanmax(lp_end[lmask]) if lmask.any() else 0) // BIN_NS) + 2
    edges = np.arange(n_bins + 1, dtype=np.float64) * BIN_NS
    busy_bins = interval_integral(sent[lmask], lp_end[lmask], edges) > 0
    busy = busy_bins[sched // BIN_NS]
    ttft = f["ttft_ms"].cast(pl.Float64).fill_null(np.nan).to_numpy()
    inp = f["input_tokens"].cast(pl.Float64).fill_null(0.0).to_numpy()
    s_busy, s_clear = ok & is_short & busy, ok & is_short & ~busy
    ev: dict[str, Any] = {
        "short": short_name,
        "long": long_name,
        "short_requests": n_short,
        "short_arrivals_with_long_prefill_share": fnum(float(busy[ok & is_short].mean()), 3),
        "long_ttft_p90_ms": fnum(_p90(ttft[ok & is_long]), 2),
        "short_ttft_p90_ms": fnum(_p90(ttft[ok & is_short]), 2),
        "thresholds": {"ratio": HOL_RATIO, "min_ms": HOL_MIN_MS},
    }
    fired, ratio = False, 0.0
    # the prefill split needs short arrivals on both sides (a standing queue may leave none
    # without a long prefill in flight: then only the queued branch below can speak)
    if s_busy.sum() >= MIN_SIDE and s_clear.sum() >= MIN_SIDE:
        p_busy, p_clear = _p90(ttft[s_busy]), _p90(ttft[s_clear])
        pred = _predicted(inp, ttft, ok & ~busy, s_busy)
        assert p_busy is not None and p_clear is not None
        ratio = p_busy / max(p_clear, 1e-9)
        over_pred = p_busy / max(pred, 1e-9) if pred is not None else None
        ev.update(
            {
                "short_ttft_p90_ms_long_prefill_in_flight": fnum(p_busy, 2),
                "short_ttft_p90_ms_no_long_prefill": fnum(p_clear, 2),
                "short_ttft_p90_ms_predicted_by_length": fnum(pred, 2),
                "inflation_vs_no_long_prefill": fnum(ratio, 3),
                "inflation_vs_predicted": fnum(over_pred, 3),
            }
        )
        fired = (
            ratio >= HOL_RATIO
            and p_busy - p_clear >= HOL_MIN_MS
            and (over_pred is None or over_pred >= HOL_RATIO)
        )
    queued = queued_evidence(sched, ttft, end - first, ok, is_short, is_long)
    ev.update(queued)
    if fired:
        t0, t1 = span(busy_bins, np.arange(n_bins))
        title = (
            f"Short requests ({short_name}) wait behind long prefills ({long_name}): their "
            f"TTFT p90 is {ratio:.1f}x higher when a long prompt is being processed"
        )
    elif queued.get("queued_behind_long_work"):
        t0, t1 = int(sched.min()), int(np.nanmax(end))  # the whole run: a standing queue
        title = (
            f"Short requests ({short_name}) queue behind long-running work ({long_name}): "
            f"at the same moments they wait {queued['short_over_long_ttft_same_moment']:.2f}x "
            "as long as the long ones, "
            f"{queued['short_ttft_over_own_generation']:.1f}x their own generation time"
        )
    else:
        return []
    return [Finding("head-of-line-blocking", "warning", title, t0, t1, ev, RECOMMEND)]


RECOMMEND = (
    "Serve the short class ahead of long work (request-level flow control): give it a "
    "lower priority number than the long class in the spec's `classes` and run the "
    "engine's priority policy (vLLM `--scheduling-policy priority`), or route long "
    "prompts to a queue or engine of their own; a smaller chunked-prefill budget also "
    "bounds the wait. Predict the gain per class before changing the server: "
    "`phaselens whatif RUN --calib CALIB.yaml --set policy.scheduling=fcfs,priority`."
)


def queued_evidence(
    sched: Any, ttft: F64, gen_ns: F64, ok: Any, is_short: Any, is_long: Any
) -> dict[str, Any]:
    """The queued branch's evidence: each served short request against the long request that
    arrived nearest to it (within PAIR_GAP_NS, or the long class's median arrival gap if
    wider): the median over them of short TTFT / long TTFT; and the short class's TTFT p50 over
    its generation time p50 (`gen_ns`: end − first token, in ns)."""
    s, lo = ok & is_short & ~np.isnan(ttft), ok & is_long & ~np.isnan(ttft)
    lt = sched[lo].astype(np.float64)
    order = np.argsort(lt, kind="stable")
    lt, l_ttft = lt[order], ttft[lo][order]
    if lt.size == 0:
        return {"queued_pairs": 0}
    gap = max(float(PAIR_GAP_NS), float(np.median(np.diff(lt))) if lt.size > 1 else 0.0)
    st = sched[s].astype(np.float64)
    j = np.clip(np.searchsorted(lt, st), 1, lt.size) - 1  # the long arrival at or before
    k = np.minimum(j + 1, lt.size - 1)  # ... and the one after
    near = np.where(np.abs(lt[k] - st) < np.abs(st - lt[j]), k, j)
    close = (np.abs(lt[near] - st) <= gap) & (l_ttft[near] > 0)
    ratios = ttft[s][close] / l_ttft[near][close]
    # (a request whose tokens all came in one read has no measurable generation time: left out)
    gen = gen_ns[s & (gen_ns > 0)] / 1e6
    if ratios.size < MIN_PAIRS or gen.size == 0:
        return {"queued_pairs": int(ratios.size)}
    same = float(np.median(ratios))
    p50 = float(np.median(ttft[s]))
    over_own = p50 / float(np.median(gen))
    return {
        "queued_pairs": int(ratios.size),
        "short_over_long_ttft_same_moment": fnum(same, 3),
        "short_ttft_over_own_generation": fnum(over_own, 3),
        "queued_behind_long_work": bool(
            same >= SAME_WAIT and over_own >= WAIT_OVER_WORK and p50 >= HOL_MIN_MS
        ),
        "thresholds_queued": {"same_moment": SAME_WAIT, "over_own_generation": WAIT_OVER_WORK},
    }
