"""A capacity per flow-control class: each probe judged per class against the class's own SLO,
and the highest load at which each class's SLO holds, against hand-worked cases."""

from __future__ import annotations

import dataclasses

from tests.analysis.helpers import make_run, rec

from phaselens.analysis.latency import request_table
from phaselens.capacity.classes import class_capacity, judge_classes


def _rt():  # type: ignore[no-untyped-def]
    # 50 short requests with TTFT 10 ms, 50 long ones with TTFT 500 ms (one every 10 ms each)
    out = []
    for i in range(50):
        s = 10.0 * i
        out.append(dataclasses.replace(rec(i, s, chunks_ms=[s + 10]), req_class="short"))
        r = rec(100 + i, s, chunks_ms=[s + 500], input_tokens=4000)
        out.append(dataclasses.replace(r, req_class="long"))
    return request_table(make_run(out).requests)


def test_each_class_judged_by_its_own_slo() -> None:
    slo = {
        "short": {"ttft_ms": {"p90": 100.0}},  # 50 values of 10 ms: interval [10, 10] ≤ 100
        "long": {"ttft_ms": {"p90": 100.0}},  # 500 ms: the lower end 500 > 100 → fails
    }
    v = judge_classes(_rt(), slo)
    assert v["short"]["verdict"] == "pass" and v["short"]["requests"] == 50
    assert v["long"]["verdict"] == "fail"
    t = v["short"]["targets"][0]
    assert (t["model"], t["observed_ms"], t["interval_ms"]) == ("short", 10.0, [10.0, 10.0])
    # the long class's own, looser SLO: 500 ≤ 1000 holds
    assert judge_classes(_rt(), {"long": {"ttft_ms": {"p90": 1000.0}}})["long"]["verdict"] == (
        "pass"
    )


def test_capacity_per_class_is_the_highest_passing_load_below_its_first_failure() -> None:
    def v(**kw: str) -> dict[str, dict[str, str]]:
        return {k: {"verdict": x} for k, x in kw.items()}

    probes = [
        (0.5, 5.0, v(short="pass", long="pass", never="fail")),
        (1.0, 10.0, v(short="pass", long="fail", never="fail")),
        (1.0, 10.0, v(short="pass", long="pass", never="fail")),  # a repeat: long failed once
        (1.5, 15.0, v(short="uncertain", long="fail", never="fail")),
        (2.0, 20.0, v(short="pass", long="fail", never="fail")),  # above short's first miss
    ]
    cap = class_capacity(probes)
    assert cap["short"] == {"load_scale": 1.0, "capacity_rps": 10.0, "upper_edge_rps": 15.0}
    assert cap["long"] == {"load_scale": 0.5, "capacity_rps": 5.0, "upper_edge_rps": 10.0}
    assert cap["never"] == {"load_scale": None, "capacity_rps": 0.0, "upper_edge_rps": 5.0}
