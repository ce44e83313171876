"""`simulate`: schedule + deployment -> frames (`phaselens.execute` writes them as a run).

Why frames built column by column: a million-request replay must not create a million Python
record objects; the frames have exactly the schemas of `rundir.schema` so analysis cannot tell a
simulated run from a measured one.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import polars as pl

from phaselens.errors import InputError
from phaselens.rundir.schema import (
    PHASES,
    PHASES_SCHEMA,
    REQUEST_SCHEMA,
    STEP_SCHEMA,
    TELEMETRY_SCHEMA,
)
from phaselens.sim.binning import IDLE_GAP_BINS, IDLE_TAIL_BINS, active_bins, telemetry_bins
from phaselens.sim.client import LoadShape
from phaselens.sim.cluster import Cluster
from phaselens.sim.config import Deployment
from phaselens.sim.cost import fp8_gemms
from phaselens.sim.deploy import default_deployment, load_deployment
from phaselens.sim.records import NO_TIME, ST_NOT_SENT, ST_OK, ST_SHED, ClusterResult
from phaselens.types import BIN_NS, Schedule


@dataclass(frozen=True, slots=True)
class SimResult:
    """Frames in the schemas of `rundir.schema`, the exact phases, and the manifest entries to
    merge."""

    requests: pl.DataFrame
    telemetry: pl.DataFrame
    steps: pl.DataFrame
    phases: pl.DataFrame
    manifest_extra: dict[str, Any]


def simulate(
    schedule: Schedule,
    deploy: Deployment,
    fast_forward: bool = True,
    shape: LoadShape | None = None,
    replies: frozenset[str] = frozenset(),
) -> SimResult:
    """Simulate every planned request on the deployment (deterministic).

    `shape`: how the simulated client sends (`sim.client`): the planned open loop (default),
    with an in-flight cap, or a closed loop of N users, as the driver would.
    `fast_forward=False` steps through decode-only stretches one by one (same result, slower;
    kept for tests and for checking the fast path). Sessions (`sim.sessions`): a turn leaves
    think time after its previous turn ended; `replies` names the models whose later turns
    carry the reply the server gave (the driver without the optional fields), the others keep
    the dataset's reply (a length-forced run, the driver's default).
    """
    shape = shape or LoadShape()
    served = {m for e in deploy.engines for m in e.serves}
    for m in schedule.models:
        if m not in served:
            raise InputError(
                f"{deploy.source}: spec model {m!r} is served by no engine "
                f"(served: {', '.join(sorted(served)) or 'none'})"
            )
    limits: dict[int, int] = {}
    for i, e in enumerate(deploy.engines):
        lim = e.kv_capacity_tokens
        if e.role == "prefill" and e.handoff_to is not None:
            lim = min(lim, deploy.engine(e.handoff_to).kv_capacity_tokens)
        if e.policy.max_model_len is not None:
            lim = min(lim, e.policy.max_model_len)
        limits[i] = lim
    cluster = Cluster(deploy)
    cluster.fast_forward = fast_forward
    res = cluster.run(schedule, limits, shape, replies)
    requests = _requests_frame(schedule, res)
    steps = _steps_frame(deploy, res)
    telemetry = _telemetry_frame(deploy, res)
    phases = _phases_frame(deploy, res)
    extra = deploy.manifest()
    extra["kind"] = "sim"
    extra["token_count_method"] = "usage"
    extra["valid"] = True
    extra["invalid_reasons"] = []
    extra["telemetry"] = {"sim": "ok"}
    extra["driver"] = shape.manifest()  # the simulated client's loop, as a driver run records it
    extra["sim"] = {
        "deployment": deploy.source,
        "cost_params": asdict(deploy.cost),
        "events": res.events,
        "fast_forward_steps": cluster.stretch_steps,
        "request_overhead_s": deploy.request_overhead_s,
        "engines": {
            deploy.engines[st.index].name: {
                "steps": st.step_idx,
                "preemptions": st.preemptions,
                "prefix_hit_rate": (
                    st.prefix_hit_tokens / st.prefix_query_tokens if st.prefix_query_tokens else 0.0
                ),
                "kv_capacity_tokens": deploy.engines[st.index].kv_capacity_tokens,
            }
            for st in res.engines
        },
        # requests refused by a queue cap (status shed, HTTP 503; `policy.max_waiting`)
        "shed": sum(st.shed for st in res.engines),
        "phases_file": PHASES,
        "telemetry_bin_ns": BIN_NS,
        # idle gaps up to `gap` bins are written in full; of a longer one only the first `tail`
        "telemetry_idle_gap_bins": IDLE_GAP_BINS,
        "telemetry_idle_tail_bins": IDLE_TAIL_BINS,
    }
    if cluster.sessions is not None:
        extra["sim"]["sessions"] = {
            "chained": True,
            "history_replies": sorted(replies & set(schedule.models)),
        }
    return SimResult(requests, telemetry, steps, phases, extra)


# ---- requests ----------------------------------------------------------------------------------
def _token_lists(n: int, res: ClusterResult) -> tuple[pl.Series, pl.Series]:
    """Expand step-index segments into per-request token times (one entry per token)."""
    logs = [lg.t1 for lg in res.logs]
    base = np.zeros(len(logs) + 1, dtype=np.int64)
    for i, lg in enumerate(logs):
        base[i + 1] = base[i] + lg.shape[0]
    explicit = res.seg_eng < 0
    n_exp = int(explicit.sum())
    pool = np.concatenate([*logs, res.seg_a[explicit]]) if logs else res.seg_a[explicit]
    start = np.empty(res.seg_rid.shape[0], dtype=np.int64)
    length = np.ones(res.seg_rid.shape[0], dtype=np.int64)
    ne = ~explicit
    start[ne] = base[res.seg_eng[ne]] + res.seg_a[ne]
    length[ne] = res.seg_b[ne] - res.seg_a[ne] + 1
    start[explicit] = base[-1] + np.arange(n_exp, dtype=np.int64)
    order = np.argsort(res.seg_rid, kind="stable")  # segments were appended in time order
    start, length, rid = start[order], length[order], res.seg_rid[order]
    total = int(length.sum())
    seg_first = np.cumsum(length) - length
    idx = np.repeat(start - seg_first, length) + np.arange(total, dtype=np.int64)
    values = pool[idx]
    counts = np.bincount(rid, weights=length, minlength=n).astype(np.int64)
    return _list_columns(n, counts, values)


def _list_columns(n: int, counts: np.ndarray, values: np.ndarray) -> tuple[pl.Series, pl.Series]:
    """List columns from flat values and per-row counts: pyarrow when present (16x faster)."""
    total = int(values.shape[0])
    ones = np.ones(total, dtype=np.int32)
    try:
        pa: Any = importlib.import_module("pyarrow")
    except ImportError:
        ids = np.repeat(np.arange(n, dtype=np.int64), counts)
        agg = (
            pl.DataFrame({"id": ids, "t": values, "c": ones})
            .group_by("id", maintain_order=True)
            .agg("t", "c")
        )
        full = pl.DataFrame({"id": np.arange(n, dtype=np.int64)}).join(agg, on="id", how="left")
        empty_t = pl.lit([], dtype=pl.List(pl.Int64))
        empty_c = pl.lit([], dtype=pl.List(pl.Int32))
        full = full.with_columns(pl.col("t").fill_null(empty_t), pl.col("c").fill_null(empty_c))
        return full["t"], full["c"]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    lst = pa.LargeListArray.from_arrays
    tok = pl.Series("token_ns", lst(pa.array(offsets), pa.array(values)))
    cnt = pl.Series("token_counts", lst(pa.array(offsets), pa.array(ones)))
    return tok.cast(pl.List(pl.Int64)), cnt.cast(pl.List(pl.Int32))


def _requests_frame(schedule: Schedule, res: ClusterResult) -> pl.DataFrame:
    n = len(schedule)
    tok, cnt = _token_lists(n, res)
    ok = res.status == ST_OK
    first = res.first_token_ns
    errors = [""] * n
    for rid, msg in res.errors.items():
        errors[rid] = msg
    models = np.asarray(schedule.models, dtype=object)
    status: Any = np.where(ok, "ok", "http_error") if n else []
    http: Any = np.where(ok, 200, 400).astype(np.int32) if n else []
    shed = res.status == ST_SHED
    if shed.any():  # refused by a queue cap (`policy.max_waiting`): the server's 503
        status = np.where(shed, "shed", status)
        http = np.where(shed, 503, http).astype(np.int32)
    sent: Any = res.sent_ns
    end: Any = res.end_ns
    cached: Any = [None] * n
    p = schedule.prompts
    if p is not None and (p.session_id >= 0).any():
        unsent = res.status == ST_NOT_SENT
        status = np.where(unsent, "not_sent", status)
        http = pl.Series(http).set(pl.Series(unsent), None)
        sent = pl.Series(sent).set(pl.Series(unsent), None)
        end = pl.Series(end).set(pl.Series(unsent), None)
        # the simulated prefix cache's hits, as a server that reports them (llama.cpp's cache_n)
        cached = pl.Series(res.hits).set(pl.Series(~ok | (p.session_id < 0)), None)
    cls_names, cls_idx = schedule.class_rows()
    ten_names, ten_idx = schedule.tenant_rows()
    df = pl.DataFrame(
        {
            "id": np.arange(n, dtype=np.int64),
            "model": pl.Series(models[schedule.model_idx] if n else [], dtype=pl.String),
            "stage": schedule.stage.astype(np.int32),
            "priority": schedule.priority.astype(np.int32),
            "scheduled_ns": res.scheduled_ns,
            "sent_ns": sent,
            "first_token_ns": pl.Series(first).set(pl.Series(first == NO_TIME), None)
            if n
            else pl.Series([], dtype=pl.Int64),
            "end_ns": end,
            "input_tokens": schedule.input_tokens.astype(np.int64),
            "output_tokens": res.delivered,
            "status": pl.Series(status, dtype=pl.String),
            "error": pl.Series(errors, dtype=pl.String),
            "http_status": pl.Series(http),
            "server_prompt_ms": pl.Series([None] * n, dtype=pl.Float64),
            "server_cached_tokens": pl.Series(cached, dtype=pl.Int64),
            "server_decode_ms": pl.Series([None] * n, dtype=pl.Float64),
            "req_class": pl.Series(cls_names, dtype=pl.String).gather(cls_idx)
            if n
            else pl.Series([], dtype=pl.String),
            "tenant": pl.Series(ten_names, dtype=pl.String).gather(ten_idx)
            if n
            else pl.Series([], dtype=pl.String),
            "token_ns": tok,
            "token_counts": cnt,
        }
    )
    return df.cast(REQUEST_SCHEMA)  # type: ignore[arg-type]


# ---- steps -------------------------------------------------------------------------------------
def _steps_frame(deploy: Deployment, res: ClusterResult) -> pl.DataFrame:
    parts = []
    for st, lg in zip(res.engines, res.logs, strict=True):
        e = deploy.engines[st.index]
        m = lg.t0.shape[0]
        parts.append(
            pl.DataFrame(
                {
                    "t_start_ns": lg.t0,
                    "t_end_ns": lg.t1,
                    "engine": pl.Series([e.name]).repeat_by(m).explode() if m else [],
                    "gpu": pl.Series([",".join(e.gpus)]).repeat_by(m).explode() if m else [],
                    "prefill_tokens": lg.prefill,
                    "decode_seqs": lg.dec,
                    "kv_tokens": lg.kv,
                    "flops": lg.flops,
                    "bytes": lg.bytes,
                },
                schema=STEP_SCHEMA,
            )
        )
    return pl.concat(parts).sort("t_start_ns", maintain_order=True)


# ---- telemetry ---------------------------------------------------------------------------------
def _cum_at(edges: np.ndarray, t0: np.ndarray, t1: np.ndarray, q: np.ndarray) -> np.ndarray:
    """∫ of a quantity spread evenly over disjoint sorted intervals, evaluated at `edges`."""
    if t0.shape[0] == 0:
        return np.zeros(edges.shape[0])
    cum = np.concatenate([[0.0], np.cumsum(q)])
    j = np.searchsorted(t1, edges, side="right")  # intervals fully before the edge
    out = cum[j]
    inside = j < t0.shape[0]
    jj = np.minimum(j, t0.shape[0] - 1)
    dur = np.maximum(t1[jj] - t0[jj], 1)
    frac = np.clip((edges - t0[jj]) / dur, 0.0, 1.0)
    return out + np.where(inside, q[jj] * frac, 0.0)


def _union(t0: np.ndarray, t1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge possibly overlapping intervals (spatial sharing) into disjoint sorted ones."""
    if t0.shape[0] == 0:
        return t0, t1
    o = np.argsort(t0, kind="stable")
    a, b = t0[o], t1[o]
    reach = np.maximum.accumulate(b)
    new = np.ones(a.shape[0], dtype=bool)
    new[1:] = a[1:] > reach[:-1]
    grp = np.cumsum(new) - 1
    starts = a[new]
    ends = np.zeros(starts.shape[0], dtype=np.int64)
    np.maximum.at(ends, grp, b)
    return starts, ends


def _telemetry_frame(deploy: Deployment, res: ClusterResult) -> pl.DataFrame:
    """Counters and gauges per 100 ms bin, only where work happened (see `sim.binning`)."""
    horizon = max((int(lg.t1[-1]) for lg in res.logs if lg.t1.shape[0]), default=0)
    nb = max(1, -(-horizon // BIN_NS))
    act = active_bins(
        np.concatenate([lg.t0 for lg in res.logs] or [np.zeros(0, np.int64)]),
        np.concatenate([lg.t1 for lg in res.logs] or [np.zeros(0, np.int64)]),
        BIN_NS,
    )
    sel = telemetry_bins(act, nb - 1)
    lo = sel * BIN_NS
    t_s = lo + BIN_NS  # a sample stamps the end of its bin
    k = sel.shape[0]
    dt = BIN_NS / 1e9
    parts: list[pl.DataFrame] = []

    def per_bin(t0: np.ndarray, t1: np.ndarray, q: np.ndarray) -> np.ndarray:
        out: np.ndarray = _cum_at(t_s, t0, t1, q) - _cum_at(lo, t0, t1, q)
        return out

    def emit(metric: str, values: np.ndarray, labels: Mapping[str, str]) -> None:
        lab = json.dumps(dict(labels), sort_keys=True, separators=(",", ":"))
        parts.append(
            pl.DataFrame({"t_ns": t_s, "value": np.asarray(values, dtype=np.float64)}).select(
                "t_ns",
                pl.lit("sim").alias("source"),
                pl.lit(metric).alias("metric"),
                "value",
                pl.lit(lab).alias("labels"),
            )
        )

    logs = {st.index: lg for st, lg in zip(res.engines, res.logs, strict=True)}
    for g in deploy.gpus:
        on = [st for st in res.engines if g.name in deploy.engines[st.index].gpus]
        t0s = [logs[st.index].t0 for st in on]
        t1s = [logs[st.index].t1 for st in on]
        a, b = _union(
            np.concatenate(t0s or [np.zeros(0, np.int64)]),
            np.concatenate(t1s or [np.zeros(0, np.int64)]),
        )
        busy = per_bin(a, b, (b - a).astype(np.float64)) / BIN_NS
        flops = np.zeros(k)
        nbytes = np.zeros(k)
        for st in on:
            tp = deploy.engines[st.index].tp
            lg = logs[st.index]
            # FLOPs run on FP8 tensor cores count against the FP8 peak (gemm_peak_scale × the
            # 16-bit one): SM % stays a share of what the GPU can do, never above 100
            m = deploy.engines[st.index].model
            scale = m.gemm_peak_scale if fp8_gemms(m, deploy.cost) else 1.0
            flops += per_bin(lg.t0, lg.t1, lg.flops / tp / scale)
            nbytes += per_bin(lg.t0, lg.t1, lg.bytes / tp)
        lab = {"gpu": g.name}
        emit("gpu.busy_pct", 100.0 * busy, lab)
        emit("gpu.sm_pct", 100.0 * flops / (g.spec.peak_flops * dt), lab)
        emit("gpu.dram_bw_pct", 100.0 * nbytes / (g.spec.bandwidth * dt), lab)
    for st in res.engines:
        e = deploy.engines[st.index]
        lab = {"engine": e.name, "gpu": ",".join(e.gpus), "model": e.model.name}
        lg = logs[st.index]
        t0, t1 = lg.t0, lg.t1
        for metric, q in (
            ("engine.prefill_tokens", lg.prefill),
            ("engine.decode_tokens", lg.dec),
        ):
            emit(metric, per_bin(t0, t1, np.asarray(q, dtype=np.float64)), lab)
        # preemptions happen at step start: counted in the bin holding the step start (a step's
        # start bin is active, so it is among the written bins)
        pre = lg.preempt.astype(np.float64)
        pos = np.minimum(np.searchsorted(sel, np.minimum(t0 // BIN_NS, nb - 1)), k - 1)
        emit(
            "engine.preemptions",
            np.bincount(pos, weights=pre, minlength=k)[:k] if t0.shape[0] else np.zeros(k),
            lab,
        )
        # gauges: the state after the last step that ended at or before the bin end
        j = np.searchsorted(t1, t_s, side="right") - 1
        has = j >= 0
        jj = np.maximum(j, 0)
        cap = max(1, e.kv_capacity_tokens)
        for metric, q, scale in (
            ("engine.running", lg.running, 1.0),
            ("engine.waiting", lg.waiting, 1.0),
            ("engine.kv_usage_pct", lg.kv, 100.0 / cap),
        ):
            arr = np.asarray(q, dtype=np.float64)
            v = np.where(has, arr[jj] * scale, 0.0) if arr.shape[0] else np.zeros(k)
            emit(metric, v, lab)
    return pl.concat(parts).cast(TELEMETRY_SCHEMA)  # type: ignore[arg-type]


def _phases_frame(deploy: Deployment, res: ClusterResult) -> pl.DataFrame:
    names = np.asarray([e.name for e in deploy.engines], dtype=object)
    n = res.end_ns.shape[0]

    def nullable(a: np.ndarray) -> pl.Series:
        s = pl.Series(a, dtype=pl.Int64)
        return s.set(pl.Series(a == NO_TIME), None) if n else s

    return pl.DataFrame(
        {
            "id": np.arange(n, dtype=np.int64),
            "engine": pl.Series(names[res.engine_of] if n else [], dtype=pl.String),
            "prefill_start_ns": nullable(res.prefill_start_ns),
            "prefill_end_ns": nullable(res.prefill_end_ns),
            "first_token_ns": nullable(res.first_token_ns),
            "end_ns": nullable(res.end_ns),
        }
    ).cast(PHASES_SCHEMA)  # type: ignore[arg-type]


# ---- run directory -----------------------------------------------------------------------------
def parse_target(target: str, model_names: list[str]) -> Deployment:
    """`sim` -> the default deployment for these models; `sim:DEPLOY.yaml` -> that file."""
    if target == "sim":
        return default_deployment(model_names)
    if target.startswith("sim:") and len(target) > 4:
        return load_deployment(target[4:])
    raise InputError(f"--target: expected `sim` or `sim:DEPLOY.yaml`, got {target!r}")
