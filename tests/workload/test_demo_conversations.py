"""The demo's conversational model: its dataset is made by a script in the repo (the committed
file is what the script writes, byte for byte), the example spec reads the same file, the
demo's deployment serves every demo model, and a (shortened) demo shows the sessions by turn
in the terminal and in the report."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import polars as pl
import pytest
import yaml

from phaselens.cli import main
from phaselens.rundir.load import load_run
from phaselens.workload.datasets import read_dataset
from phaselens.workload.plan import build_schedule
from phaselens.workload.spec import demo_deploy_path, demo_spec_path, load_spec

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "make_demo_conversations.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_demo_conversations", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_committed_dataset_is_what_the_script_writes() -> None:
    data = demo_spec_path().parent / "demo-conversations.json"
    assert data.read_text(encoding="utf-8") == _script().render()
    assert (ROOT / "examples" / "demo-conversations.json").read_bytes() == data.read_bytes()
    rows = json.loads(data.read_text())
    assert len(rows) == 40
    systems = {c["conversations"][0]["value"] for c in rows}
    assert len(systems) == 4  # shared system prompts: the prefix a cache can reuse
    turns = [sum(m["from"] == "human" for m in c["conversations"]) for c in rows]
    assert min(turns) >= 2 and max(turns) <= 6


def test_the_demo_plans_every_dataset_turn_of_each_session() -> None:
    ws = load_spec(demo_spec_path())
    s = build_schedule(ws)
    assert s.models == ("chat-8b", "big-70b", "assist-8b")
    p = s.prompts
    assert p is not None
    conv = s.model_idx == 2
    assert (p.session_id[conv] >= 0).all() and (p.session_id[~conv] == -1).all()
    data = read_dataset(demo_spec_path().parent / "demo-conversations.json", "sharegpt")
    users = np.asarray([sum(r == "user" for r, _ in c) for c in data.rows])
    for sid in np.unique(p.session_id[conv]).tolist()[:20]:
        rows = np.flatnonzero(p.session_id == sid)
        row = int(p.row[rows[0]])
        assert sorted(p.turn[rows].tolist()) == list(range(users[row]))  # turns: dataset


def test_the_demo_deployment_serves_every_demo_model() -> None:
    d = yaml.safe_load(demo_deploy_path().read_text())
    served = [m for e in d["engines"] for m in e["serves"]]
    assert sorted(served) == sorted(m.name for m in load_spec(demo_spec_path()).models)
    chat = next(e for e in d["engines"] if "assist-8b" in e["serves"])
    assert "chat-8b" in chat["serves"]  # one engine: the conversations share its caches
    ex = yaml.safe_load((ROOT / "examples" / "deploy" / "seed-two-models.yaml").read_text())
    assert sorted(m for e in ex["engines"] for m in e["serves"]) == sorted(served)


def test_a_short_demo_shows_sessions_by_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = demo_spec_path().read_text().replace("duration_s: 60}", "duration_s: 10}")
    spec = tmp_path / "demo.yaml"
    spec.write_text(text)
    (tmp_path / "demo-conversations.json").write_bytes(
        (demo_spec_path().parent / "demo-conversations.json").read_bytes()
    )
    argv = ["phaselens", "demo", "--spec", str(spec), "--out", str(tmp_path / "runs")]
    monkeypatch.setattr(sys, "argv", [*argv, "--target", f"sim:{demo_deploy_path()}"])
    with pytest.raises(SystemExit) as e:
        main()
    cap = capsys.readouterr()
    assert e.value.code in (0, None), cap.err
    assert "turns of" in cap.out.splitlines()[0] and "assist-8b" in cap.out.splitlines()[0]
    assert "Sessions (" in cap.out and "by turn" in cap.out
    assert "not chain" not in cap.err  # the simulator chains the turns (issue 18 item 4)
    run = load_run(next((tmp_path / "runs").glob("*/report.html")).parent)
    turns = run.requests.filter(pl.col("turn").is_not_null())
    cached = turns.group_by(pl.col("turn") > 0).agg(
        (pl.col("server_cached_tokens").sum() / pl.col("input_tokens").sum()).alias("share")
    )
    share = dict(zip(cached["turn"].to_list(), cached["share"].to_list(), strict=True))
    assert share[True] > share[False], share  # later turns find their history in the cache
    report = next((tmp_path / "runs").glob("*/report.html")).read_text()
    assert '<section id="sessions">' in report and "Sessions by turn" in report
