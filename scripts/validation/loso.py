"""Leave-one-source-out validation of the GPU simulator (run by gpu_table.py).

Each source of `published_gpu.yaml` (a vendor page or release) is one fold: the shape constants
are fitted on every row of the other sources (`fit_gpu.coordinate_search`, the search that set
the defaults), then the held-out source's rows are simulated with that fold's constants. The
errors of those held-out rows are reported per regime (`regime`), per metric and per engine
family (`family`), so no row is scored with constants its own source helped choose.
"""

from __future__ import annotations

import math
import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from fit_gpu import SEARCH, coordinate_search, mean_abs_log

Row = dict[str, Any]
Cost = dict[str, float]
MeasureRows = Callable[[Sequence[Row], Cost], list[float]]

TARGET_MEDIAN = 0.10  # median |error| per (regime, metric) with at least MIN_ROWS rows
TARGET_WORST = 0.30  # and no row worse than this
MIN_ROWS = 5
REGIMES = (
    "batch-1 decode",
    "mid-batch throughput",
    "large-batch throughput",
    "short-prompt TTFT",
    "long-prompt TTFT",
    "KV-limited overload",
)
METRIC_ORDER = ("ttft_ms", "tpot_ms", "itl_ms", "throughput_out")
# engine string (lower case) -> family, for sources without a `family:` field
FAMILY_HINTS = (
    ("tensorrt", "trtllm"),
    ("trt", "trtllm"),
    ("lmdeploy", "lmdeploy"),
    ("turbomind", "lmdeploy"),
    ("vllm", "vllm"),
    ("sglang", "sglang"),
)


def regime(row: Row, kv_capacity_tokens: int | None) -> str:
    """The row's regime, by the first rule that holds:
    1. `KV-limited overload`: the row says `kv_limited: true`, or its KV demand
       batch × (isl + osl) tokens exceeds `kv_capacity_tokens` (what its simulated deployment's
       KV cache holds; None: unknown, the rule reads the flag only);
    2. a TTFT metric (its name starts with `ttft`): `long-prompt TTFT` when isl ≥ 1024, else
       `short-prompt TTFT`;
    3. any other metric (tpot, itl, throughput, ...) by batch (or concurrency) B:
       `batch-1 decode` when B ≤ 8 and osl > 1, `large-batch throughput` when B ≥ 64, else
       `mid-batch throughput`."""
    b = int(row.get("batch", row.get("concurrency", 1)))
    isl, osl = int(row["isl"]), int(row["osl"])
    if row.get("kv_limited") or (
        kv_capacity_tokens is not None and b * (isl + osl) > kv_capacity_tokens
    ):
        return "KV-limited overload"
    if str(row["metric"]).startswith("ttft"):
        return "long-prompt TTFT" if isl >= 1024 else "short-prompt TTFT"
    if b <= 8 and osl > 1:
        return "batch-1 decode"
    return "large-batch throughput" if b >= 64 else "mid-batch throughput"


def family(row: Row, sources: dict[str, Any]) -> str:
    """The source's `family:` (trtllm, lmdeploy, vllm, sglang), else guessed from the row's
    `engine` string, else the engine's first word."""
    fam = sources.get(row["src"], {}).get("family")
    if fam:
        return str(fam)
    engine = str(row.get("engine", "")).lower()
    for hint, name in FAMILY_HINTS:
        if hint in engine:
            return name
    return engine.split()[0] if engine.split() else "unknown"


def fitted(row: Row) -> bool:
    """Whether the row enters a fold's fit. A trtllm-bench throughput run (`requests` sent all
    at once to an engine capped at `batch`, thousands of them) is scored in its own fold but
    never fitted: one simulation takes about a second, ~50x a fixed-batch row, and a fold's
    search simulates its fit rows about 70 times. Every other row (a fixed batch, a closed loop)
    is fitted."""
    return not (row.get("requests") and row.get("loop") != "closed")


def _work(row: Row) -> int:
    """A rough size of the row's simulation (the longest go first)."""
    return int(row.get("batch", 1)) * (int(row["isl"]) + int(row["osl"]))


class Simulations:
    """`measure(row, cost)` over many rows, memoized on (source, row id, constants): folds that
    try the same constants share the simulations. The rows not simulated yet run in `jobs`
    processes, longest first."""

    def __init__(self, measure: Callable[[Row, Cost], float], jobs: int = 1) -> None:
        self.measure = measure
        self.jobs = jobs
        self.cache: dict[tuple[str, str, tuple[tuple[str, float], ...]], float] = {}
        self.simulated = 0  # simulations run (cache misses)
        self._pool: ProcessPoolExecutor | None = None

    def __call__(self, rows: Sequence[Row], cost: Cost) -> list[float]:
        key = tuple(sorted(cost.items()))
        todo = sorted(
            (r for r in rows if (r["src"], r["id"], key) not in self.cache), key=_work, reverse=True
        )
        if self.jobs > 1 and len(todo) > 1:
            if self._pool is None:
                ctx = multiprocessing.get_context("spawn")  # no fork: polars threads deadlock it
                self._pool = ProcessPoolExecutor(self.jobs, mp_context=ctx)
            values = list(self._pool.map(self.measure, todo, [cost] * len(todo)))
        else:
            values = [self.measure(r, cost) for r in todo]
        for r, v in zip(todo, values, strict=True):
            self.cache[(r["src"], r["id"], key)] = v
        self.simulated += len(todo)
        return [self.cache[(r["src"], r["id"], key)] for r in rows]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


@dataclass(frozen=True)
class Fold:
    source: str
    train: int  # rows fitted on (every other source's that `fitted` admits)
    cost: Cost  # the constants fitted without the source
    train_loss: float  # mean |log error| of the fitted rows
    history: tuple[float, ...]  # the training loss after each pass
    rows: tuple[Row, ...]  # the held-out rows
    simulated: tuple[float, ...]  # with the fold's constants

    def converged(self, passes: int) -> bool:
        """The search stopped because a pass kept nothing (not at the pass limit)."""
        h = self.history
        return len(h) < passes or (len(h) >= 2 and h[-1] == h[-2])

    @property
    def held_loss(self) -> float:
        return mean_abs_log(self.rows, self.simulated)


def fit_fold(
    rows: Sequence[Row],
    source: str,
    measure_rows: MeasureRows,
    start: Cost,
    passes: int,
    on_pass: Callable[[float, Cost], None] | None = None,
) -> Fold:
    """Fit the constants on the rows of every source but `source` (those `fitted`), then
    simulate `source`'s rows with them; `source`'s rows are measured once, after the fit, and
    never enter it."""
    train = [r for r in rows if r["src"] != source and fitted(r)]
    held = [r for r in rows if r["src"] == source]
    if not train or not held:
        raise ValueError(f"fold {source}: {len(train)} rows to fit, {len(held)} held out")
    cost, best, history = coordinate_search(
        lambda c: mean_abs_log(train, measure_rows(train, c)), start, passes, on_pass
    )
    simulated = measure_rows(held, cost)
    return Fold(source, len(train), cost, best, tuple(history), tuple(held), tuple(simulated))


def run(
    rows: Sequence[Row],
    measure_rows: MeasureRows,
    start: Cost,
    passes: int,
    log: Callable[[str], None] | None = None,
) -> list[Fold]:
    """One fold per source that has rows, in the order the rows name them; `log` hears of
    each pass and fold."""
    say = log or (lambda _: None)
    folds = []
    for s in dict.fromkeys(r["src"] for r in rows):

        def on_pass(best: float, _cost: Cost, s: str = s) -> None:
            say(f"fold {s}: pass done, fit mean abs log error {best:.4f}")

        f = fit_fold(rows, s, measure_rows, start, passes, on_pass)
        say(f"fold {s}: held out {len(f.rows)} rows, mean abs log error {f.held_loss:.4f}")
        folds.append(f)
    return folds


@dataclass(frozen=True)
class Scored:
    row: Row
    simulated: float  # with its fold's constants (fitted without its source)
    default: float  # with the default constants
    regime: str
    family: str

    @property
    def error(self) -> float:
        return self.simulated / float(self.row["value"]) - 1.0

    @property
    def default_error(self) -> float:
        return self.default / float(self.row["value"]) - 1.0


def score(
    folds: Sequence[Fold],
    defaults: dict[str, float],
    sources: dict[str, Any],
    kv_capacity: Callable[[Row], int | None],
) -> list[Scored]:
    """Every held-out row with its fold's value, its value with the defaults (by row id), its
    regime and its engine family."""
    return [
        Scored(r, v, defaults[r["id"]], regime(r, kv_capacity(r)), family(r, sources))
        for f in folds
        for r, v in zip(f.rows, f.simulated, strict=True)
    ]


def _metrics(scored: Sequence[Scored]) -> list[str]:
    present = {s.row["metric"] for s in scored}
    return [m for m in METRIC_ORDER if m in present] + sorted(present - set(METRIC_ORDER))


def _median_abs(xs: Sequence[float]) -> float:
    return float(np.median(np.abs(xs))) if xs else math.nan


def verdict(errors: Sequence[float]) -> str:
    """Against the targets: median ≤ 10 % where there are at least 5 rows, no row worse than
    30 %."""
    med, worst = _median_abs(errors), max(abs(e) for e in errors)
    miss = []
    if len(errors) >= MIN_ROWS and med > TARGET_MEDIAN:
        miss.append(f"median > {TARGET_MEDIAN:.0%}")
    if worst > TARGET_WORST:
        miss.append(f"a row > {TARGET_WORST:.0%}")
    if miss:
        return "**miss**: " + ", ".join(miss)
    return "pass" if len(errors) >= MIN_ROWS else f"pass (worst only: < {MIN_ROWS} rows)"


def _group_lines(scored: Sequence[Scored], key: Callable[[Scored], str], order: Sequence[str]):
    lines = []
    for g in order:
        for m in _metrics(scored):
            sel = [s for s in scored if key(s) == g and s.row["metric"] == m]
            if not sel:
                continue
            errs = [s.error for s in sel]
            worst = max(sel, key=lambda s: abs(s.error))
            within = sum(abs(e) <= TARGET_WORST for e in errs)
            lines.append(
                f"| {g} | {m} | {len(sel)} | {_median_abs(errs):.1%} | "
                f"{worst.row['id']} ({worst.error:+.1%}) | {within}/{len(sel)} | "
                f"{_median_abs([s.default_error for s in sel]):.1%} | {verdict(errs)} |"
            )
    return lines


HEADER = (
    "| {} | metric | rows | median abs error | worst row | within 30% | "
    "median with the defaults | target |"
)


# Why a (regime, metric) group misses its target, said under the table while it misses (read
# off the rows when it was written; the table itself is regenerated).
MISS_NOTES = {
    ("short-prompt TTFT", "ttft_ms"): (
        "Short-prompt TTFT misses the median target with the default constants too (the "
        "column beside it), so the miss is not the fit leaking: a 128-token prefill at batch 1 "
        "costs 2.5-4x its roofline, set by fixed costs (`gemm_m_half`, `per_layer_overhead_s`, "
        "`allreduce_latency_s`) that are one value for every GPU and engine, and the sources "
        "pull them apart: TensorRT-LLM 0.5 on H100 FP8 and L40S comes out 19-23 % too fast "
        "(sim/pub 0.77-0.81), lmdeploy's TurboMind on A100 15-17 % too slow (1.15-1.17), "
        "A100 TensorRT-LLM within 3 %. One shared small-M GEMM efficiency cannot fit both; "
        "the model would need it per GPU type (FP8 vs 16-bit tiles) or per engine."
    ),
}


def notes(scored: Sequence[Scored]) -> list[str]:
    """The notes of the groups that miss a target now."""
    out = []
    for (g, m), text in MISS_NOTES.items():
        errs = [s.error for s in scored if s.regime == g and s.row["metric"] == m]
        if errs and verdict(errs).startswith("**miss"):
            out += ["", text]
    return out


def regime_table(scored: Sequence[Scored]) -> list[str]:
    return [
        HEADER.format("regime"),
        "|---|---|---|---|---|---|---|---|",
        *_group_lines(scored, lambda s: s.regime, REGIMES),
    ]


def family_table(scored: Sequence[Scored]) -> list[str]:
    fams = sorted({s.family for s in scored})
    return [
        HEADER.format("engine family"),
        "|---|---|---|---|---|---|---|---|",
        *_group_lines(scored, lambda s: s.family, fams),
    ]


def _const(x: float) -> str:
    return f"{x:.3g}"


def fold_tables(
    folds: Sequence[Fold], start: Cost, sources: dict[str, Any], passes: int
) -> list[str]:
    lines = [
        "| held-out source | family | rows held out | rows fitted | passes (fit loss after "
        "each) | converged | fit mean abs log error | held-out mean abs log error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for f in folds:
        fam = family(f.rows[0], sources)
        trail = " → ".join(f"{x:.4f}" for x in f.history)
        lines.append(
            f"| {f.source} | {fam} | {len(f.rows)} | {f.train} | {len(f.history)} ({trail}) | "
            f"{'yes' if f.converged(passes) else 'no: pass limit'} | {f.train_loss:.4f} | "
            f"{f.held_loss:.4f} |"
        )
    lines += [
        "",
        "Constants each fold found (fitted without the source named; the default is the "
        "starting point):",
        "",
        "| constant | default | " + " | ".join(f"without {f.source}" for f in folds) + " |",
        "|---|---|" + "---|" * len(folds),
    ]
    for n in SEARCH:
        vals = " | ".join(_const(f.cost[n]) for f in folds)
        lines.append(f"| {n} | {_const(start[n])} | {vals} |")
    return lines


def misses(scored: Sequence[Scored]) -> list[str]:
    bad = sorted((s for s in scored if abs(s.error) > TARGET_WORST), key=lambda s: -abs(s.error))
    if not bad:
        return ["None."]
    return [
        f"- {s.row['id']} ({s.row['src']}, {s.regime}, {s.row['metric']}): {s.error:+.1%} "
        f"(with the defaults {s.default_error:+.1%})"
        for s in bad
    ]


def overall(scored: Sequence[Scored]) -> list[str]:
    """One line per metric over every held-out row, and the regimes that miss."""
    lines = []
    for m in _metrics(scored):
        errs = [s.error for s in scored if s.row["metric"] == m]
        lines.append(
            f"{m}: {len(errs)} rows, median abs error {_median_abs(errs):.1%}, worst "
            f"{max(abs(e) for e in errs):.1%}"
        )
    bad = [line for line in _group_lines(scored, lambda s: s.regime, REGIMES) if "miss" in line]
    lines.append(
        "(regime, metric) groups that miss a target: "
        + ("; ".join(" ".join(b.split(" | ")[0:2]).lstrip("| ") for b in bad) if bad else "none")
    )
    return lines
