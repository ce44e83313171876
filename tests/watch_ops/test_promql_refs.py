"""The reference checker itself: it must see what a query uses, or the contract tests are void."""

from __future__ import annotations

from tests.watch_ops.promql import off_contract, refs


def test_refs_finds_metrics_labels_and_grouping() -> None:
    r = refs(
        'max by (engine) (phaselens_queue_requests{engine=~"$engine"}) > on(engine) '
        'phaselens:ttft_p90_slo_seconds and phaselens_gpu_util_ratio{gpu="0",window!="5m"}'
    )
    assert r.metrics == {"phaselens_queue_requests", "phaselens_gpu_util_ratio"}
    assert r.selector_labels == {
        ("phaselens_queue_requests", "engine"),
        ("phaselens_gpu_util_ratio", "gpu"),
        ("phaselens_gpu_util_ratio", "window"),
    }
    assert r.grouping_labels == {"engine"}


def test_off_contract_names_unknown_metrics_and_labels() -> None:
    assert off_contract('phaselens_kv_usage_ratio{engine="a"}') == []
    assert off_contract("phaselens_kv_usage_percent") == ["metric phaselens_kv_usage_percent"]
    assert off_contract('phaselens_kv_usage_ratio{gpu="0"}') == [
        "label gpu on phaselens_kv_usage_ratio"
    ]
    assert off_contract("sum by (model) (phaselens_queue_requests)") == ["grouping label model"]
