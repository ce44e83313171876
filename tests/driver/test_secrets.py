"""No secret reaches disk or a message: URL password, Basic credential, API key, header values
and query values are sent to the server, and masked everywhere a run writes or prints.

The fake server's `echo` fault answers 401 with the request's headers and URL in its message
(as some proxies do), so the secrets come back inside error texts too. Every file of the run
is searched as raw bytes, and its Parquet files decoded (every string cell, every label).
"""

from __future__ import annotations

import base64
import json
import urllib.request
from pathlib import Path

import polars as pl
from typer.testing import CliRunner

from phaselens.cli import app

from .conftest import fake_server

PASSWORD = "Zq81x%40Pass"  # percent-encoded in the URL: the server gets "Zq81x@Pass"
QUERY_VALUE = "QK-7731-secret"
HEADER_VALUE = "HdrVal-98765"
API_KEY = "sk-test-ApiKey-4242"
SPEC = """\
name: secrets
seed: 1
duration_s: 1
models:
  - name: m
    rate: 8
    arrival: {type: constant}
    input_tokens: {type: fixed, value: 8}
    output_tokens: {type: fixed, value: 4}
"""


def _cli(args: list[str], tmp: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    """`phaselens run` in this process (as the CLI runs it); exit code, stdout + stderr."""
    spec = tmp / "spec.yaml"
    spec.write_text(SPEC)
    res = CliRunner().invoke(app, ["run", str(spec), *args], env=env)
    return res.exit_code, res.stdout + res.stderr + repr(res.exception or "")


def _strings(path: Path) -> list[str]:
    """Every string a Parquet file holds: string cells, and the keys/values of label JSON."""
    df = pl.read_parquet(path)
    out: list[str] = list(df.columns)
    for name in df.columns:  # nested cells (lists, structs) as their text too
        out += [str(x) for x in df[name].drop_nulls().to_list()]
    return out


def _find_secrets(run_root: Path, output: str, secrets: list[str]) -> list[str]:
    """Where any secret appears: `<file>: <secret>` for raw bytes and decoded Parquet."""
    found = []
    files = [p for p in run_root.rglob("*") if p.is_file()]
    assert any(p.name == "manifest.json" for p in files)
    assert any(p.name == "requests.parquet" for p in files)
    for p in files:
        raw = p.read_bytes()
        texts = [raw.decode("latin-1")]
        if p.suffix == ".parquet":
            texts += _strings(p)
        for s in secrets:
            if any(s in t for t in texts):
                found.append(f"{p.name}: {s}")
    found += [f"output: {s}" for s in secrets if s in output]
    return found


def test_url_password_query_and_header_never_reach_disk(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    basic = base64.b64encode(b"alice:Zq81x@Pass").decode()
    with fake_server("--faults", "ok,echo") as url:
        port = url.rsplit(":", 1)[1]
        target = f"http://alice:{PASSWORD}@127.0.0.1:{port}/v1?api_key={QUERY_VALUE}"
        rc, output = _cli(
            [
                "--target",
                target,
                "--header",
                f"X-Custom-Token: {HEADER_VALUE}",
                "--telemetry",
                "engine",
                "--telemetry-interval",
                "0.2",
                "--out",
                str(out),
            ],
            tmp_path,
        )
        with urllib.request.urlopen(f"{url}/log", timeout=10) as r:
            log = json.load(r)
    assert rc == 0, output
    # the secrets were sent: Basic credential from the URL, the header, the query string
    assert log and all(e["headers"].get("Authorization") == f"Basic {basic}" for e in log)
    assert all(e["headers"].get("X-Custom-Token") == HEADER_VALUE for e in log)
    (run,) = out.iterdir()
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["target"] == f"http://alice:***@127.0.0.1:{port}/v1?api_key=***"
    assert manifest["driver"]["header_names"] == ["X-Custom-Token"]
    (engine_key,) = [k for k in manifest["telemetry"] if k.startswith("engine@")]
    assert engine_key == f"engine@http://alice:***@127.0.0.1:{port}/metrics"
    req = pl.read_parquet(run / "requests.parquet")
    denied = req.filter(pl.col("http_status") == 401)
    assert denied.height == req.height // 2  # every other request was echoed back
    echoed = "denied: auth=Basic *** token=*** url=/v1/chat/completions?api_key=***"
    assert all(e.startswith("HTTP 401") and echoed in e for e in denied["error"])
    tel = pl.read_parquet(run / "telemetry.parquet")
    assert tel.filter(pl.col("source") == "scrape").height > 0  # the labels were written
    secrets = [PASSWORD, "Zq81x@Pass", basic, QUERY_VALUE, HEADER_VALUE]
    assert _find_secrets(out, output, secrets) == []


def test_api_key_and_header_never_reach_disk(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    with fake_server("--faults", "echo,ok") as url:
        rc, output = _cli(
            [
                "--target",
                url,
                "--api-key-env",
                "PL_TEST_KEY",
                "--header",
                f"X-Custom-Token: Bearer {HEADER_VALUE}",
                "--telemetry",
                "none",
                "--out",
                str(out),
            ],
            tmp_path,
            {"PL_TEST_KEY": API_KEY},
        )
        with urllib.request.urlopen(f"{url}/log", timeout=10) as r:
            log = json.load(r)
    assert rc == 0, output
    assert log and all(e["headers"].get("Authorization") == f"Bearer {API_KEY}" for e in log)
    req = pl.read_parquet(next(out.iterdir()) / "requests.parquet")
    denied = req.filter(pl.col("http_status") == 401)
    assert denied.height == (req.height + 1) // 2
    assert all("denied: auth=Bearer *** token=***" in e for e in denied["error"])
    assert _find_secrets(out, output, [API_KEY, HEADER_VALUE]) == []
