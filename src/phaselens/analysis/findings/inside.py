"""Rules read from the engine's own profiler timeline (timeline.parquet): what the device waited
for inside and between steps, per phase and window. Each names the phase, the window and the fix.

Why separate from host-gap: host-gap infers host time from 100 ms busy % alone; these measure it
per step from the engine's trace, and say which cause (launch, sync, copies, communication).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import polars as pl

from phaselens.analysis.findings.base import Analysis, Missing, RuleResult
from phaselens.analysis.stats import as_int, fnum
from phaselens.analysis.timeline import shares
from phaselens.types import Finding

MIN_STEPS = 4  # steps of one phase in one window before a share is trusted
HOST_BOUND = 0.30  # share of the step cycle spent between steps (host)
LAUNCH_BOUND = 0.15  # share of the cycle idle waiting for kernel launches
SHORT_KERNELS = 0.5  # share of kernels shorter than their launch call
SYNC_STALL = 0.10
COPY_EXPOSED = 0.05
COMM_EXPOSED = 0.10
GEMM_SHARE = 0.30  # GEMM share of kernel time before its tensor-core share matters
TENSOR_CORE_LOW = 0.50


def _groups(a: Analysis) -> list[tuple[str, str, pl.DataFrame, dict[str, Any]]]:
    """(window, phase, steps, shares) for each window and phase with enough steps."""
    st = a.engine_steps
    assert st is not None
    out = []
    for (w, ph), g in st.group_by(["window", "phase"], maintain_order=True):
        if g.height >= MIN_STEPS and ph != "unlabelled":
            out.append((str(w), str(ph), g, shares(g)))
    return out


def _span(g: pl.DataFrame) -> tuple[int | None, int | None]:
    return as_int(g["t_start_ns"].min() or 0), as_int(g["t_end_ns"].max() or 0)


def _rule(
    code: str,
    title: str,
    fires: Callable[[dict[str, Any]], bool],
    evidence: Callable[[dict[str, Any]], dict[str, Any]],
    fix: str,
    device: bool,
) -> Callable[[Analysis], RuleResult]:
    def rule(a: Analysis) -> RuleResult:
        if a.engine_steps is None:
            return Missing(
                "an engine profiler trace (phaselens run --profile, or phaselens timeline --trace)"
            )
        groups = _groups(a)
        if device and not any(s.get("device") for *_, s in groups):
            return Missing("device events in the profiler trace (a GPU engine's trace)")
        out = []
        for w, ph, g, s in groups:
            if device and not s.get("device"):
                continue
            if not fires(s):
                continue
            t0, t1 = _span(g)
            stage = g["stage"].drop_nulls()
            ev = {"window": w, "phase": ph, "stage": int(stage.mode()[0]) if stage.len() else None}
            ev |= {"steps": s["steps"], **evidence(s)}
            if code == "host-bound-steps":
                ev |= _cpu_ops(a, w)
            out.append(Finding(code, "warning", f"{title} ({ph}, window {w})", t0, t1, ev, fix))
        return out

    rule.__name__ = code.replace("-", "_")
    return rule


def _cpu_ops(a: Analysis, window: str) -> dict[str, Any]:
    """The CPU ops the trace shows between this window's steps (timeline/hostwork.py)."""
    files = (a.manifest.get("timeline") or {}).get("files") or []
    mine = [f for f in files if isinstance(f, dict) and f.get("window") == window]
    if not mine:
        return {}
    ops = mine[0].get("between_steps_cpu_ops") or []
    return {
        "cpu_ops_between_steps_ms": ", ".join(f"{n} {ms:g}" for n, ms in ops[:4]) or None,
        "cpu_ops_cover_share": mine[0].get("between_steps_cpu_covered"),
    }


def _f(x: Any) -> Any:
    return fnum(float(x), 3) if x is not None else None


host_bound_steps = _rule(
    "host-bound-steps",
    "The engine spends much of each step cycle on the host between steps",
    lambda s: (s.get("between_steps_share") or 0) >= HOST_BOUND,
    lambda s: {
        "between_steps_share": _f(s.get("between_steps_share")),
        "gap_ms_p50": _f(s.get("gap_ms_p50")),
        "step_ms_p50": _f(s.get("step_ms_p50")),
        "thresholds": {"between_steps_share_at_least": HOST_BOUND},
    },
    "The time between steps is the engine's Python loop: scheduling, input preparation, "
    "sampling, detokenizing and streaming. Turn on asynchronous scheduling / output processing "
    "(vLLM --async-scheduling), larger batches per step, and check the engine process is not "
    "sharing its core (host.cpu_pct). The CPU ops the trace shows in those gaps are in the "
    "evidence; what they do not cover is Python outside any profiled op (the scheduler, output "
    "processing): profile with torch_profiler_with_stack to name it.",
    device=False,
)
launch_bound = _rule(
    "launch-bound",
    "Kernels wait for their launch: many short kernels, the GPU starved by the CPU",
    lambda s: (
        (s["inside_idle_share"]["launch"] >= LAUNCH_BOUND)
        or ((s.get("short_kernel_share") or 0) >= SHORT_KERNELS and s.get("graph_launches", 0) == 0)
    ),
    lambda s: {
        "idle_launch_share": _f(s["inside_idle_share"]["launch"]),
        "short_kernel_share": _f(s.get("short_kernel_share")),
        "kernels_per_step": _f(s.get("kernels_per_step")),
        "graph_launches": s.get("graph_launches"),
        "thresholds": {
            "idle_launch_share_at_least": LAUNCH_BOUND,
            "short_kernels_at_least": SHORT_KERNELS,
        },
    },
    "Capture the step in CUDA graphs (vLLM: drop --enforce-eager, cover the decode batch sizes "
    "with cudagraph capture sizes; SGLang: --cuda-graph-max-bs) and fuse small kernels "
    "(torch.compile); launch-bound decode is fixed on the host, not in the kernels.",
    device=True,
)
sync_stalls = _rule(
    "sync-stalls",
    "The device idles at synchronization points inside steps",
    lambda s: s["inside_idle_share"]["sync"] >= SYNC_STALL,
    lambda s: {
        "idle_sync_share": _f(s["inside_idle_share"]["sync"]),
        "thresholds": {"at_least": SYNC_STALL},
    },
    "A host read of a device value (.item(), .tolist(), a blocking copy) stops the pipeline; "
    "keep sampling outputs on the device until the step ends, use non-blocking copies and "
    "the engine's asynchronous output path.",
    device=True,
)
exposed_copies = _rule(
    "exposed-copies",
    "Memory copies run with no compute beside them",
    lambda s: (
        (s.get("memcpy_exposed_share") or 0) >= COPY_EXPOSED
        or s["inside_idle_share"]["memcpy"] >= COPY_EXPOSED
    ),
    lambda s: {
        "memcpy_exposed_share": _f(s.get("memcpy_exposed_share")),
        "idle_memcpy_share": _f(s["inside_idle_share"]["memcpy"]),
        "thresholds": {"at_least": COPY_EXPOSED},
    },
    "Copy from pinned host memory with non_blocking=True on a side stream so copies overlap "
    "compute; pageable copies are synchronous (Nsight's cuda_memcpy_async rule).",
    device=True,
)
exposed_comm = _rule(
    "exposed-communication",
    "Collective communication is not hidden behind compute",
    lambda s: (s.get("comm_exposed_share") or 0) >= COMM_EXPOSED,
    lambda s: {
        "comm_exposed_share": _f(s.get("comm_exposed_share")),
        "thresholds": {"at_least": COMM_EXPOSED},
    },
    "Tensor-parallel all-reduce on the critical path: use a faster link (NVLink, custom "
    "all-reduce), fewer TP ranks for a model that fits, or overlap communication with compute.",
    device=True,
)
low_tensor_core = _rule(
    "low-tensor-core-gemm",
    "GEMM time runs mostly outside tensor-core kernels",
    lambda s: (
        (s.get("kernel_class_share") or {}).get("gemm", 0) >= GEMM_SHARE
        and s.get("gemm_tensor_core_share") is not None
        and s["gemm_tensor_core_share"] < TENSOR_CORE_LOW
    ),
    lambda s: {
        "gemm_share": _f((s.get("kernel_class_share") or {}).get("gemm")),
        "gemm_tensor_core_share": _f(s.get("gemm_tensor_core_share")),
        "thresholds": {"gemm_share_at_least": GEMM_SHARE, "tensor_core_below": TENSOR_CORE_LOW},
    },
    "Serve in bf16/fp16 or fp8 (not fp32), keep GEMM dimensions multiples of 8/16, and check "
    "the kernel names: a GEMM without a tensor-core kernel is leaving most of the GPU's peak.",
    device=True,
)


#: The rules that need an engine profiler trace (a simulated run never has one).
TRACE_RULES = (
    "host-bound-steps",
    "launch-bound",
    "sync-stalls",
    "exposed-copies",
    "exposed-communication",
    "low-tensor-core-gemm",
)
