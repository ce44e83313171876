"""Step labels parsed from engines' real annotation names (TraceLens' and our traces)."""

from __future__ import annotations

import pytest

from phaselens.timeline import StepLabel, parse_step
from phaselens.timeline.annotations import merge_labels

CASES = [
    # from tests/data/traces/tracelens/vllm_prefilldecode_piecewise
    ("execute_8192_context_9(sq8155sk8430sqsq7475785sqsk7671310)_generation_37"
     "(sq37sk34489sqsq37sqsk34489)",
     StepLabel("vllm", "mixed", 9, 8155, 37, 37, 8430, 34489, 7671310, 34489)),
    ("execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk55086sqsq32sqsk55086)",
     StepLabel("vllm", "decode", 0, 0, 32, 32, 0, 55086, 0, 55086)),
    # the vLLM 0.32 CPU build trace (tests/data/traces/vllm-cpu)
    ("execute_context_3(429)_generation_1(1)", StepLabel("vllm", "mixed", 3, 429, 1, 1)),
    ("execute_context_0(0)_generation_4(4)", StepLabel("vllm", "decode", 0, 0, 4, 4)),
    ("execute_context_2(14721)_generation_0(0)", StepLabel("vllm", "prefill", 2, 14721, 0, 0)),
    ("execute_new_1_cached_0", StepLabel("vllm", "prefill", 1, None, 0, None)),
    ("execute_new_0_cached_5", StepLabel("vllm", "decode", 0, None, 5, None)),
    ("step[EXTEND bs=15 toks=15360]", StepLabel("sglang", "prefill", 15, 15360, 0, 0)),
    ("step[DECODE bs=32]", StepLabel("sglang", "decode", 0, 0, 32, 32)),
    ("step[MIXED bs=2 c=1 g=1 c_sq=5 c_sk=8 c_sqsq=25 c_sqsk=40 g_sq=1 g_sk=12 g_sqsq=1 "
     "g_sqsk=12]", StepLabel("sglang", "mixed", 1, 5, 1, 1, 8, 12, 40, 12)),
    ("step[DECODE bs=64 g_sq=128 g_sqsq=256 g_sqsk=262144 g_sk=131072]",
     StepLabel("sglang", "decode", 0, 0, 64, 128, None, 131072, None, 262144)),
    ("execute_context_0(0)_generation_0(0)", StepLabel("vllm", "empty", 0, 0, 0, 0)),
]  # fmt: skip


@pytest.mark.parametrize(("name", "label"), CASES)
def test_parse_step(name: str, label: StepLabel) -> None:
    assert parse_step(name) == label


@pytest.mark.parametrize("name", ["execute_model", "cudaLaunchKernel", "step", "gpu_model_runner"])
def test_not_a_step(name: str) -> None:
    assert parse_step(name) is None


def test_sglang_twin_is_one_label_with_the_detailed_counts() -> None:
    outer = parse_step("execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32"
                       "(sq32sk32785sqsq32sqsk32785)")  # fmt: skip
    inner = parse_step("step[DECODE bs=32]")
    assert outer is not None and inner is not None
    assert merge_labels(outer, inner) == StepLabel(
        "sglang", "decode", 0, 0, 32, 32, 0, 32785, 0, 32785
    )
