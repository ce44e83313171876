"""The context-length preflight: llama.cpp `/props` and vLLM `/v1/models` read before a run,
one warning line naming how many planned requests exceed the context, and a note in the
manifest; a server without those endpoints (or a slow one) never fails the run."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from phaselens.driver.options import DriverOptions
from phaselens.driver.preflight import context_notes, server_context
from phaselens.execute import HttpTarget, Options, execute

from .conftest import app_server, fake_server, make_schedule

# Shapes as the servers print them (abridged to the fields around the one we read).
LLAMA_PROPS = {
    "default_generation_settings": {
        "id": 0,
        "id_task": -1,
        "n_ctx": 64,
        "speculative": False,
        "is_processing": False,
        "params": {"n_predict": -1, "seed": 4294967295, "temperature": 0.8},
        "prompt": "",
        "next_token": {"has_next_token": True, "n_remain": -1, "n_decoded": 0},
    },
    "total_slots": 1,
    "model_path": "models/tiny.gguf",
    "chat_template": "{{ messages }}",
    "build_info": "b4000-abcdef",
}
VLLM_MODELS = {
    "object": "list",
    "data": [
        {
            "id": "served-a",
            "object": "model",
            "created": 1733000000,
            "owned_by": "vllm",
            "root": "/models/a",
            "parent": None,
            "max_model_len": 100,
            "permission": [{"id": "modelperm-1", "object": "model_permission"}],
        },
        {
            "id": "served-b",
            "object": "model",
            "created": 1733000000,
            "owned_by": "vllm",
            "root": "/models/b",
            "parent": None,
            "max_model_len": 30,
            "permission": [],
        },
    ],
}


@contextmanager
def info_server(
    routes: dict[str, Callable[[web.Request], Any]],
) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A tiny aiohttp server on 127.0.0.1 in a thread; yields its URL and the request log."""
    seen: list[dict[str, str]] = []

    def wrap(fn: Callable[[web.Request], Any]) -> Callable[[web.Request], Any]:
        async def h(request: web.Request) -> web.StreamResponse:
            seen.append({"path": request.path_qs, **dict(request.headers)})
            resp: web.StreamResponse = await fn(request)
            return resp

        return h

    def build(app: web.Application) -> None:
        for path, fn in routes.items():
            app.router.add_get(path, wrap(fn))

    with app_server(build) as url:
        yield url, seen


def _json(obj: Any) -> Callable[[web.Request], Any]:
    async def h(request: web.Request) -> web.Response:
        return web.json_response(obj)

    return h


def test_llama_props_context_with_the_run_credentials() -> None:
    with info_server({"/props": _json(LLAMA_PROPS)}) as (url, seen):
        base = url.replace("http://", "http://bob:pw@") + "/v1?api_key=k1"
        got = server_context(base, "m", {"Authorization": "Basic Ym9iOnB3", "X-A": "1"})
    assert got is not None and (got.tokens, got.where) == (64, "llama.cpp /props n_ctx")
    assert seen[0]["path"] == "/props?api_key=k1"  # root of the server, the query kept
    assert seen[0]["Authorization"] == "Basic Ym9iOnB3" and seen[0]["X-A"] == "1"


def test_vllm_models_max_model_len_per_served_model() -> None:
    with info_server({"/v1/models": _json(VLLM_MODELS)}) as (url, seen):
        a = server_context(url + "/v1", "served-a", {})
        b = server_context(url + "/v1/chat/completions", "served-b", {})
        unknown = server_context(url, "other", {})  # two models, none of that name
    assert a is not None and (a.tokens, a.where) == (100, "/v1/models max_model_len")
    assert b is not None and b.tokens == 30
    assert unknown is None
    assert [s["path"] for s in seen] == ["/v1/models"] * 3  # /props answered 404 each time


@pytest.mark.parametrize(
    "props",
    [
        {"default_generation_settings": {"n_ctx": "4096"}},
        {"default_generation_settings": {"n_ctx": -1}},
        {"n_ctx": True},
        {"n_ctx": 10**30},
        ["not", "an", "object"],
    ],
)
def test_absurd_answers_mean_unknown(props: Any) -> None:
    with info_server({"/props": _json(props)}) as (url, _):
        assert server_context(url, "m", {}) is None


def test_counts_requests_over_the_context_per_model() -> None:
    # b (context 30): 20+10 = 30 fits, 25+10 = 35 is over; a (context 100): 90+20 over, 5+5 fits
    s = make_schedule(
        [0, 1, 2, 3],
        out_tokens=[10, 10, 20, 5],
        in_tokens=[20, 25, 90, 5],
        models=("a", "b"),
        model_idx=[1, 1, 0, 0],
    )
    with info_server({"/v1/models": _json(VLLM_MODELS)}) as (url, _):
        notes = context_notes(s, {"*": url}, {"a": "served-a", "b": "served-b"}, {}, None)
    got = {(n.model, n.context, n.over, n.planned) for n in notes}
    assert got == {("a", 100, 1, 2), ("b", 30, 1, 2)}


def test_drive_warns_once_and_notes_the_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sched = make_schedule([0.0, 5.0, 10.0], out_tokens=4, in_tokens=[8, 70, 8])
    with info_server({"/props": _json(LLAMA_PROPS)}) as (url, _):
        # (it serves no completions: the requests fail, which is not what this test is about)
        res = execute(
            sched,
            HttpTarget({"*": url}),
            Options(driver=DriverOptions(), telemetry="none", handle_sigint=False),
            tmp_path,
        )
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("phaselens: warning:")]
    assert lines == [
        f"phaselens: warning: 1 of 3 planned requests for m need more tokens (input + output) "
        f"than the server's context of 64 (llama.cpp /props n_ctx) at {url}; the server may "
        "refuse them or cut them short (counted at the planned lengths; without --tokenizer "
        "the server may count more)"
    ]
    manifest = json.loads((res.path / "manifest.json").read_text())
    assert manifest["server_context"] == [
        {
            "target": url,
            "model": "m",
            "context_tokens": 64,
            "source": "llama.cpp /props n_ctx",
            "requests_over": 1,
        }
    ]
    assert manifest["warnings"] == [lines[0].removeprefix("phaselens: warning: ")]


def test_no_endpoint_or_no_server_is_no_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sched = make_schedule([0.0, 5.0], out_tokens=4)
    with fake_server() as url:  # no /props, no /v1/models: 404s
        res = execute(
            sched,
            HttpTarget({"*": url}),
            Options(driver=DriverOptions(), telemetry="none", handle_sigint=False),
            tmp_path,
        )
    assert res.by_status == {"ok": 2}
    manifest = json.loads((res.path / "manifest.json").read_text())
    assert "server_context" not in manifest and "warning" not in capsys.readouterr().err
    # a port nobody listens on: unknown, at once
    assert server_context("http://127.0.0.1:9", "m", {}) is None
