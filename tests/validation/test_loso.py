"""scripts/validation/loso.py: the regime rule, the engine family, the targets, and the
leave-one-source-out folds (a fold never fits on its held-out source's rows)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parents[2] / "scripts" / "validation"


@pytest.fixture(scope="module")
def loso() -> Any:
    sys.path.insert(0, str(HERE))  # loso.py imports fit_gpu.py from beside it
    try:
        import loso

        yield loso
    finally:
        sys.path.remove(str(HERE))


def _row(**kw: Any) -> dict[str, Any]:
    return {"id": "r", "src": "s", "batch": 1, "isl": 128, "osl": 128, "metric": "tpot_ms", **kw}


@pytest.mark.parametrize(
    ("row", "capacity", "expected"),
    [
        (_row(batch=1), 10_000, "batch-1 decode"),
        (_row(batch=8, metric="throughput_out"), 10_000, "batch-1 decode"),
        (_row(batch=8, metric="itl_ms"), 10_000, "batch-1 decode"),
        (_row(batch=9, metric="throughput_out"), 10_000, "mid-batch throughput"),
        (_row(batch=63, metric="tpot_ms"), None, "mid-batch throughput"),
        (_row(batch=64, metric="throughput_out"), 100_000, "large-batch throughput"),
        (_row(batch=1, osl=1, metric="throughput_out"), None, "mid-batch throughput"),
        (_row(metric="ttft_ms", isl=1024, osl=1), 10_000, "long-prompt TTFT"),
        (_row(metric="ttft_ms", isl=1023), 10_000, "short-prompt TTFT"),
        (_row(metric="ttft_p50_ms", isl=2048, osl=1), None, "long-prompt TTFT"),
        # batch x (isl + osl) = 64 x 256 = 16,384 tokens of KV
        (_row(batch=64), 16_383, "KV-limited overload"),
        (_row(batch=64), 16_384, "large-batch throughput"),
        (_row(metric="ttft_ms", isl=2048, batch=8), 8 * 2100, "KV-limited overload"),
        (_row(batch=2, kv_limited=True), None, "KV-limited overload"),
        (_row(batch=1, concurrency=32), None, "batch-1 decode"),  # batch wins
        (
            {k: v for k, v in _row().items() if k != "batch"} | {"concurrency": 128},
            None,
            "large-batch throughput",
        ),
    ],
)
def test_regime(loso: Any, row: dict[str, Any], capacity: int | None, expected: str) -> None:
    assert loso.regime(row, capacity) == expected


def test_family_from_the_source_else_the_engine(loso: Any) -> None:
    sources = {"a": {"family": "sglang"}, "b": {}}
    assert loso.family({"src": "a", "engine": "vLLM 0.6"}, sources) == "sglang"
    assert loso.family({"src": "b", "engine": "vLLM 0.6.3"}, sources) == "vllm"
    assert loso.family({"src": "b", "engine": "TensorRT-LLM 0.9.0"}, sources) == "trtllm"
    assert loso.family({"src": "b", "engine": "lmdeploy 0.1.0a1"}, sources) == "lmdeploy"
    assert loso.family({"src": "c", "engine": "Foo 1"}, sources) == "foo"


def test_verdict_against_the_targets(loso: Any) -> None:
    assert loso.verdict([0.05, -0.08, 0.1, 0.02, 0.0]) == "pass"
    assert "median > 10%" in loso.verdict([0.2, -0.15, 0.12, 0.11, 0.0])
    assert "a row > 30%" in loso.verdict([0.0, 0.0, 0.0, 0.0, -0.31])
    # under 5 rows the median target does not apply, the worst-row one does
    assert loso.verdict([0.2, 0.25]).startswith("pass (worst only")
    assert "a row > 30%" in loso.verdict([0.2, 0.35])


# A fake simulator: the metric is eta_linear x k. Sources a and b were measured with
# eta_linear = 0.8; c, with more rows than a and b together, with 0.4 (a fit that saw c's rows
# would move towards 0.4).
ROWS = [
    {"id": f"{s}{i}", "src": s, "k": k, "value": eta * k, "metric": "throughput_out"}
    | {"batch": 1, "isl": 1, "osl": 128}
    for s, eta, n in (("a", 0.8, 2), ("b", 0.8, 2), ("c", 0.4, 5))
    for i, k in enumerate(range(1, n + 1))
]


def fake_measure(row: dict[str, Any], cost: dict[str, float]) -> float:
    return cost["eta_linear"] * row["k"]


def test_a_fold_never_fits_on_its_held_out_source(loso: Any) -> None:
    calls: list[tuple[set[str], dict[str, float]]] = []

    def measure_rows(rows: list[dict[str, Any]], cost: dict[str, float]) -> list[float]:
        calls.append(({r["src"] for r in rows}, dict(cost)))
        return [fake_measure(r, cost) for r in rows]

    start = {n: 1.0 for n in loso.SEARCH} | {"eta_linear": 0.72}
    fold = loso.fit_fold(ROWS, "c", measure_rows, start, passes=5)
    *fit, last = calls
    assert fit and all(srcs == {"a", "b"} for srcs, _ in fit)
    assert last == ({"c"}, fold.cost) and len(fold.rows) == 5 and fold.train == 4
    assert fold.cost["eta_linear"] == pytest.approx(0.72 * 1.1)  # towards a and b's 0.8
    assert fold.simulated == tuple(0.72 * 1.1 * k for k in range(1, 6))
    # the same search on every row goes the other way: c's rows would have changed the fit
    every, _, _ = loso.coordinate_search(
        lambda c: loso.mean_abs_log(ROWS, [fake_measure(r, c) for r in ROWS]), start, 5
    )
    assert every["eta_linear"] < 0.72


def test_run_scores_every_row_once_with_its_own_fold(loso: Any) -> None:
    sims = loso.Simulations(fake_measure, jobs=1)
    start = {n: 1.0 for n in loso.SEARCH} | {"eta_linear": 0.72}
    folds = loso.run(ROWS, sims, start, passes=5)
    assert [f.source for f in folds] == ["a", "b", "c"]
    for f in folds:
        alone = [r for r in ROWS if r["src"] != f.source]
        cost, best, _ = loso.coordinate_search(
            lambda c, rows=alone: loso.mean_abs_log(rows, [fake_measure(r, c) for r in rows]),
            start,
            5,
        )
        assert f.cost == cost and f.train_loss == best
    defaults = {r["id"]: 0.72 * r["k"] for r in ROWS}
    scored = loso.score(folds, defaults, {}, lambda r: None)
    assert sorted(s.row["id"] for s in scored) == sorted(r["id"] for r in ROWS)
    c_errors = [s.error for s in scored if s.row["src"] == "c"]
    assert all(e == pytest.approx(0.72 * 1.1 / 0.4 - 1) for e in c_errors)
    (line,) = [x for x in loso.regime_table(scored) if x.startswith("| batch-1 decode |")]
    assert line.startswith("| batch-1 decode | throughput_out | 9 |") and "**miss**" in line


def test_the_cache_simulates_each_row_and_constants_once(loso: Any) -> None:
    seen: list[str] = []

    def counting(row: dict[str, Any], cost: dict[str, float]) -> float:
        seen.append(row["id"])
        return fake_measure(row, cost)

    sims = loso.Simulations(counting, jobs=1)
    cost = {"eta_linear": 0.5}
    assert sims(ROWS[:4], cost) == [0.5, 1.0, 0.5, 1.0]
    assert sims(ROWS, cost) == [fake_measure(r, cost) for r in ROWS]
    assert sorted(seen) == sorted(r["id"] for r in ROWS) and sims.simulated == len(ROWS)


def test_kv_capacity_of_the_simulated_deployment(loso: Any) -> None:
    spec = importlib.util.spec_from_file_location("gpu_table_loso_test", HERE / "gpu_table.py")
    assert spec is not None and spec.loader is not None
    table = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = table  # (dataclasses resolve their module)
    try:
        spec.loader.exec_module(table)
        _, rows = table.load()
        row = next(r for r in rows if r["id"] == "lmd-70b-tp4-b64-128-2048")
        cap = table.kv_capacity(row)
        assert 64 * (128 + 2048) < cap < 64 * 100 * 2176  # fits, and not absurdly
        assert loso.regime(row, cap) == "large-batch throughput"
        assert loso.regime({**row, "batch": cap // 2176 + 1}, cap) == "KV-limited overload"
    finally:
        sys.modules.pop(spec.name, None)


def test_a_miss_note_shows_only_while_its_group_misses(loso: Any) -> None:
    def scored(errors: list[float]) -> list[Any]:
        rows = [_row(id=f"t{i}", metric="ttft_ms", osl=1, value=1.0) for i in range(len(errors))]
        return [
            loso.Scored(r, 1.0 + e, 1.0 + e, loso.regime(r, None), "trtllm")
            for r, e in zip(rows, errors, strict=True)
        ]

    assert loso.notes(scored([0.2] * 5)) and "Short-prompt TTFT" in loso.notes(scored([0.2] * 5))[1]
    assert loso.notes(scored([0.05] * 5)) == []


def test_queued_throughput_runs_are_scored_but_never_fitted(loso: Any) -> None:
    """A trtllm-bench row (`requests` all at once to an engine capped at `batch`, above or
    below the cap) stays out of every fold's fit; a closed loop and a fixed batch go in."""
    assert not loso.fitted({"batch": 4096, "requests": 30000})
    assert not loso.fitted({"batch": 4096, "requests": 1500})  # below the cap: still queued
    assert loso.fitted({"batch": 100, "requests": 500, "loop": "closed"})
    assert loso.fitted({"batch": 64}) and not loso.fitted({"batch": 64, "requests": 64})
    queued = {"id": "q", "src": "a", "k": 1, "batch": 2, "requests": 9}
    rows = [*ROWS, queued]
    seen: list[set[str]] = []

    def measure_rows(rs: list[dict[str, Any]], cost: dict[str, float]) -> list[float]:
        seen.append({r["id"] for r in rs})
        return [fake_measure(r, cost) for r in rs]

    start = {n: 1.0 for n in loso.SEARCH} | {"eta_linear": 0.72}
    fold = loso.fit_fold(rows, "c", measure_rows, start, passes=2)
    assert fold.train == 4 and all("q" not in ids for ids in seen)
    held = loso.fit_fold(rows, "a", measure_rows, start, passes=2)
    assert "q" in {r["id"] for r in held.rows}
