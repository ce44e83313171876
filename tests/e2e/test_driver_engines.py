"""phaselens' driver against real engines: a small staged workload per engine, and a two-model
run with one engine per model (llama.cpp serves one model name, vLLM the other).

What must hold on a real server, not a mock:
- every planned request is recorded `ok` with exactly the forced output length;
- continuous batching is visible: many requests in flight at once, seen both from the records'
  overlapping [sent, end] intervals and from the engine's own running gauge in the run's
  telemetry (scraped by the driver's sampler);
- the client's mean TTFT agrees with vLLM's own `vllm:time_to_first_token_seconds` histogram
  over the run (sum/count deltas), within the tolerance justified below;
- in the two-model run each engine generated exactly the tokens of the model routed to it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest

from phaselens import load_run
from phaselens.driver.options import DriverOptions
from phaselens.execute import HttpTarget, Options, RunInfo, execute
from phaselens.workload.plan import build_schedule
from phaselens.workload.spec import parse_spec

from .conftest import LLAMACPP_MODEL, PARALLEL, VLLM_MODEL
from .helpers import GEN_TOKENS, max_overlap, overlap_held_ns, scrape

pytestmark = pytest.mark.e2e

TTFT = "vllm:time_to_first_token_seconds"


def _model(name: str, rate: float) -> dict[str, Any]:
    return {
        "name": name,
        "rate": rate,
        "arrival": {"type": "poisson"},
        "input_tokens": {"type": "uniform", "min": 16, "max": 96},
        "output_tokens": {"type": "uniform", "min": 16, "max": 64},
    }


def _staged(models: list[dict[str, Any]], seed: int = 3) -> Any:
    """30% -> 70% -> 100% of the rate, 2 s each: the seed's staged load, small."""
    data = {
        "name": "e2e-staged",
        "seed": seed,
        "stages": [
            {"rate_scale": 0.3, "duration_s": 2},
            {"rate_scale": 0.7, "duration_s": 2},
            {"rate_scale": 1.0, "duration_s": 2},
        ],
        "models": models,
    }
    spec = parse_spec(data, "e2e", Path("."))
    return spec, build_schedule(spec)


def _run(schedule: Any, spec: Any, targets: dict[str, str], tmp: Path, **kw: Any) -> Any:
    res = execute(
        schedule,
        HttpTarget(targets),
        Options(
            driver=DriverOptions(endpoint="chat", timeout_s=120, idle_timeout_s=60, **kw),
            quiet=True,
            telemetry="engine",
            telemetry_interval_s=0.1,
            handle_sigint=False,
        ),
        tmp,
        RunInfo(name=spec.name, spec=spec.model_dump(mode="json")),
    )
    assert res.status == "complete"
    return res, load_run(res.path)


def _check_records(run: Any, schedule: Any) -> pl.DataFrame:
    req = run.requests.sort("id")
    assert req.height == len(schedule), "one record per planned request"
    bad = req.filter(pl.col("status") != "ok")
    assert bad.height == 0, bad.select("id", "status", "error", "http_status").head(5)
    planned = [int(x) for x in schedule.output_tokens[: len(schedule)]]
    ids = schedule.ids if schedule.ids is not None else range(len(schedule))
    want = dict(zip((int(i) for i in ids), planned, strict=True))
    got = dict(zip(req["id"].to_list(), req["output_tokens"].to_list(), strict=True))
    assert got == want, "output lengths differ from the forced ones"
    for r in req.iter_rows(named=True):
        assert r["sent_ns"] <= r["first_token_ns"] <= r["end_ns"]
        assert sum(r["token_counts"]) == r["output_tokens"]
    return req


@pytest.mark.parametrize("kind", ["llamacpp", "vllm"])
def test_staged_workload(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    eng = request.getfixturevalue(kind)
    spec, schedule = _staged([_model("chat", 24.0)])
    assert 50 <= len(schedule) <= 150
    before = scrape(eng.url)
    res, run = _run(schedule, spec, {"*": eng.url}, tmp_path, model_map={"chat": eng.model})
    after = scrape(eng.url)
    req = _check_records(run, schedule)
    assert res.by_status == {"ok": len(schedule)}

    # The context-length preflight asked the real engine (llama.cpp /props, vLLM /v1/models)
    # and counted the planned requests over it by the same rule: input + output > context.
    (ctx,) = run.manifest["server_context"]
    assert ctx["model"] == "chat" and 0 < ctx["context_tokens"] <= 1024, ctx
    assert ctx["source"].startswith("llama.cpp" if kind == "llamacpp" else "/v1/models"), ctx
    need = schedule.input_tokens.astype(int) + schedule.output_tokens.astype(int)
    assert ctx["requests_over"] == int((need > ctx["context_tokens"]).sum())

    # The engine generated exactly what the records say was received.
    name = GEN_TOKENS[kind]
    assert after[name] - before[name] == req["output_tokens"].sum()

    # Batching, from the engine's own gauge as the driver's sampler recorded it ...
    tel = run.telemetry
    running = tel.filter(pl.col("metric") == "engine.running")
    assert running.height >= 20, "engine telemetry every ~100 ms over ~6 s"
    # the gauge saw the engine work, and never more than its slots
    assert 1 <= running["value"].max() <= PARALLEL, running["value"].to_list()
    # ... and from the records: every request the engine ran at once was on the wire at once,
    # so the records' peak overlap is at least the sampled gauge's peak (a fixed count flaked
    # on a faster machine: requests of ~50 ms overlap less at the same rate)
    spans = list(zip(req["sent_ns"].to_list(), req["end_ns"].to_list(), strict=True))
    assert max_overlap(spans) >= running["value"].max(), max_overlap(spans)
    # more than one request at once = batching: the gauge must have seen 2 wherever the records
    # show two requests on the wire together for 300 ms or more (three sample instants, so no
    # 100 ms sampling can miss it). A fixed "≥ 2" flaked: on a fast machine (CI) 16-64-token
    # answers finish between samples, and the records then show no such stretch either.
    if overlap_held_ns(spans, 2) >= 300_000_000:
        assert running["value"].max() >= 2, running["value"].to_list()

    # Stages: every stage got requests, more at higher load.
    per_stage = req.group_by("stage").len().sort("stage")["len"].to_list()
    assert len(per_stage) == 3 and per_stage[0] < per_stage[2]

    # llama.cpp reports its own per-request timings in the final event; vLLM does not.
    prompt_ms = req["server_prompt_ms"].to_list()
    if kind == "llamacpp":
        ttft_send = ((req["first_token_ns"] - req["sent_ns"]) / 1e6).to_list()
        e2e_send = ((req["end_ns"] - req["sent_ns"]) / 1e6).to_list()
        decode_ms = req["server_decode_ms"].to_list()
        cached = req["server_cached_tokens"].to_list()
        for pm, t, dm, e, c, n in zip(
            prompt_ms, ttft_send, decode_ms, e2e_send, cached, req["input_tokens"], strict=True
        ):
            # the engine processed the prompt between the send and the first token
            assert pm is not None and 0 < pm <= t + 0.5, (pm, t)
            assert dm is not None and 0 < dm <= e + 0.5, (dm, e)
            assert c is not None and 0 <= c <= n, (c, n)
    else:
        assert set(prompt_ms) == {None}

    if kind == "vllm":
        # Client mean TTFT vs vLLM's own histogram over exactly this run.
        n = after[TTFT + "_count"] - before[TTFT + "_count"]
        assert n == len(schedule)
        engine_ms = 1e3 * (after[TTFT + "_sum"] - before[TTFT + "_sum"]) / n
        client = req.select(((pl.col("first_token_ns") - pl.col("sent_ns")) / 1e6).mean())
        client_ms = float(client.item())
        # vLLM starts its clock when the API server has the request (after HTTP parsing) and
        # stops it when the engine core emits the first token; the client also sees the
        # request's trip in, the detokenize/SSE/HTTP trip out and its own event loop, all on
        # the same 2 loaded cores. The client can never be faster than the engine's own
        # measurement (beyond timer noise), and the extra is a few ms per request on a quiet
        # machine; with a CPU hog on one of the 2 cores it was +67% (259 vs 155 ms: the API
        # server's way out starved). Tolerance: 0.5 ms below (causal); 2x + 50 ms above, which
        # still fails a TTFT taken at the response's end or at a later event (docs/engines.md).
        assert client_ms >= engine_ms - 0.5, (client_ms, engine_ms)
        assert client_ms <= engine_ms * 2.0 + 50.0, (client_ms, engine_ms)


def test_two_models_one_engine_each(llamacpp: Any, vllm: Any, tmp_path: Path) -> None:
    spec, schedule = _staged([_model("alpha", 10.0), _model("beta", 10.0)], seed=5)
    b_llama, b_vllm = scrape(llamacpp.url), scrape(vllm.url)
    _, run = _run(
        schedule,
        spec,
        {"alpha": llamacpp.url, "beta": vllm.url},
        tmp_path,
        model_map={"alpha": LLAMACPP_MODEL, "beta": VLLM_MODEL},
    )
    a_llama, a_vllm = scrape(llamacpp.url), scrape(vllm.url)
    req = _check_records(run, schedule)
    per_model = dict(req.group_by("model").agg(pl.col("output_tokens").sum()).iter_rows())
    assert set(per_model) == {"alpha", "beta"}
    # Routing: each engine generated exactly its own model's tokens (vLLM would 404 a wrong
    # model name, llama.cpp accepts any name, so its counter is the proof for alpha).
    gl, gv = GEN_TOKENS["llamacpp"], GEN_TOKENS["vllm"]
    assert a_llama[gl] - b_llama[gl] == per_model["alpha"]
    assert a_vllm[gv] - b_vllm[gv] == per_model["beta"]
    # Telemetry from both engines landed in the one run.
    sources = set(run.telemetry.filter(pl.col("metric") == "engine.running")["source"].to_list())
    assert sources == {"llamacpp", "vllm"}
