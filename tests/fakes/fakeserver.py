"""Test servers for the driver: a timing-truth server and a fault server (own process each).

Why a separate process: the server must not share the client's GIL or event loop, or the
client's timing would be measured against itself. Both processes read the same monotonic clock
(`perf_counter_ns` is CLOCK_MONOTONIC on Linux), so the server can report when it wrote each
chunk and the test compares those instants with the driver's stamps directly.

Run: `python fakeserver.py --port 0 [--t0-ms 20,50] [--d-ms 5,10] [--usage continuous|final|none]
[--per-chunk 1] [--faults kind,kind,...] [--reject-optional] [--idle-close-ms T] [--slots K]`;
prints `PORT <n>` when ready. Request i (from the `X-Request-Id: pl-<tag>-<i>` header) uses
profile i mod len(list) and, with `--faults`, fault kind faults[i mod len] (FAULTS: broken
responses; UNTRUSTED: valid streams carrying absurd numbers). `--idle-close-ms T`: a request
that arrives on a keep-alive connection idle for T ms or more gets that connection closed
without a response, as when a server's close of an idle connection crosses the client's next
request. `--slots K`: at most K requests are served at once, the others wait for a slot (as
llama-server's `-np` slots; their t0 starts when they get one). GET /health answers 200 (an
engine's readiness); GET /truth returns what was written and when; GET /log the requests as
received (headers and body keys); GET /stats how many connections were closed that way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import struct
import sys
import time
from typing import Any

from aiohttp import web

if __package__:  # imported as tests.fakes.fakeserver (the tests read its tables)
    from .serve import serve
else:  # run as a script, `python tests/fakes/fakeserver.py`: its folder is sys.path[0]
    from serve import serve

FAULTS = (
    "ok",  # a normal stream
    "weird",  # valid but awkward SSE: CRLF, comments, odd fields, multi-line data, keep-alives
    "noend",  # a normal stream that ends by closing, without [DONE]
    "500body",
    "500",
    "429body",
    "429",
    "reset",  # two tokens, then a TCP reset
    "stall",  # two tokens, then silence
    "malformed",  # lines that are not SSE fields, between valid events (to be ignored)
    "nonjson",  # a data payload that is not JSON
    "errorobj",  # an {"error": ...} object in the stream
    "giant",  # the first content chunk is 8 MB
    "noheaders",  # the response headers never come
    "json200",  # 200 with a plain JSON body instead of a stream
    "resetafterdone",  # a complete stream, [DONE] included, then a reset before the body's end
)

# Valid streams whose numbers are absurd: the last event (usage, with llama.cpp-style `timings`
# for the timings_* kinds) carries what the name says. Its raw JSON text, after `"usage":`.
_DIGITS = "7" * 5000  # Python's int() refuses strings of more than 4300 digits
_T_OK = '{"prompt_n": 8, "prompt_ms": 12.5, "cache_n": 3, "predicted_ms": 40.25}'
UNTRUSTED: dict[str, tuple[str, str]] = {  # kind -> (completion_tokens, timings) as JSON text
    "usage_1e20": ("100000000000000000000", ""),
    "usage_digits": (_DIGITS, ""),  # (also as prompt_tokens)
    "usage_negative": ("-5", ""),
    "usage_float": ("3.5", ""),
    "usage_nan": ("NaN", ""),
    "usage_string": ('"4"', ""),
    "timings_ok": ("", _T_OK),
    "timings_str": ("", '"fast"'),
    "timings_strings": ("", '{"prompt_ms": "12", "cache_n": "0", "predicted_ms": "3"}'),
    "timings_nested": ("", '{"prompt_ms": {"v": 1}, "cache_n": [1], "predicted_ms": {"x": {}}}'),
    "timings_nan": ("", '{"prompt_ms": NaN, "cache_n": Infinity, "predicted_ms": -Infinity}'),
    "timings_huge": ("", '{"prompt_ms": 1e308, "cache_n": 1e20, "predicted_ms": -1}'),
    "timings_digits": ("", '{"prompt_ms": 1.5, "cache_n": ' + _DIGITS + "}"),
    "timings_unclosed": ("", '{"prompt_ms": 1.5, "cache_n": [[[[['),
}


def _untrusted_end(kind: str, n: int, pt: int) -> bytes:
    """The last event of an UNTRUSTED stream: usage (and timings) as the kind says."""
    ct, timings = UNTRUSTED[kind]
    ptxt = _DIGITS if kind == "usage_digits" else str(pt)
    usage = f'{{"prompt_tokens": {ptxt}, "completion_tokens": {ct or n}}}'
    tail = f', "timings": {timings}' if timings else ""
    return f'data: {{"id": "x", "choices": [], "usage": {usage}{tail}}}\n\n'.encode()


def _chunk(i: int, text: str, ct: int | None, pt: int, chat: bool) -> bytes:
    choice: dict[str, Any] = (
        {"index": 0, "delta": {"content": text}, "finish_reason": None}
        if chat
        else {"index": 0, "text": text, "finish_reason": None}
    )
    obj: dict[str, Any] = {"id": f"x{i}", "object": "chunk", "choices": [choice]}
    if ct is not None:
        obj["usage"] = {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _usage_only(n: int, pt: int) -> bytes:
    obj = {
        "id": "x",
        "choices": [],
        "usage": {"prompt_tokens": pt, "completion_tokens": n, "total_tokens": pt + n},
    }
    return b"data: " + json.dumps(obj).encode() + b"\n\n"  # note: with spaces after ':'


def _reset(request: web.Request) -> None:
    """Abort the connection with a TCP reset (SO_LINGER 0), not a clean close."""
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    if request.transport is not None:
        request.transport.abort()


GIANT = _chunk(0, "x" * (8 << 20), None, 1, True)


class State:
    def __init__(self, args: argparse.Namespace) -> None:
        self.t0_ms = [float(x) for x in args.t0_ms.split(",")]
        self.d_ms = [float(x) for x in args.d_ms.split(",")]
        self.usage = args.usage
        self.per_chunk = args.per_chunk
        self.faults = args.faults.split(",") if args.faults else ["ok"]
        self.reject_optional = args.reject_optional
        self.idle_close_s = args.idle_close_ms / 1e3
        self.idle_since: dict[Any, float] = {}  # transport -> when its last response ended
        self.closed_idle = 0
        self.truth: dict[str, dict[str, Any]] = {}
        self.log: list[dict[str, Any]] = []
        self.open = 0  # streams being written
        self.slots = asyncio.Semaphore(args.slots) if args.slots > 0 else None


async def handle(request: web.Request) -> web.StreamResponse:
    st: State = request.app["state"]
    tr = request.transport
    since = st.idle_since.pop(tr, None)
    if (
        st.idle_close_s
        and tr is not None
        and since is not None
        and time.monotonic() - since >= st.idle_close_s
    ):
        st.closed_idle += 1
        tr.close()  # idle too long: closed, the request unanswered
        return web.Response(status=503)  # (never reaches the closed connection)
    try:
        if st.slots is None:
            return await _handle(request, st)
        async with st.slots:  # wait for a slot; t0 is counted from here
            return await _handle(request, st)
    finally:
        if tr is not None and not tr.is_closing():
            st.idle_since[tr] = time.monotonic()


async def _handle(request: web.Request, st: State) -> web.StreamResponse:
    recv_ns = time.perf_counter_ns()
    raw = await request.read()
    body = json.loads(raw)
    xid = request.headers.get("X-Request-Id", "pl-x-0")
    peer = request.transport.get_extra_info("peername") if request.transport else None
    st.log.append(
        {
            "headers": dict(request.headers),
            "keys": sorted(body),
            "path": request.path,
            "port": peer[1] if peer else None,
        }
    )
    if st.reject_optional and ("ignore_eos" in body or "stream_options" in body):
        return web.json_response({"detail": "extra fields not permitted"}, status=422)
    i = int(xid.rsplit("-", 1)[1])
    t0 = st.t0_ms[i % len(st.t0_ms)] / 1e3
    d = st.d_ms[i % len(st.d_ms)] / 1e3
    fault = st.faults[i % len(st.faults)]
    n = int(body["max_tokens"])
    chat = "messages" in body
    pt = len(str(body.get("prompt") or body["messages"][0]["content"]).split())
    writes: list[int] = []  # just before each chunk's write
    written: list[int] = []  # just after it (the bytes are in the kernel by then)
    st.truth[xid] = {
        "recv_ns": recv_ns,
        "writes": writes,
        "written": written,
        "n": n,
        "t0": t0,
        "d": d,
        "fault": fault,
    }

    if fault == "echo":  # (not in FAULTS; the secrets test) a 401 that echoes what it got
        h = request.headers
        seen = f"auth={h.get('Authorization')} token={h.get('X-Custom-Token')}"
        seen += f" url={request.path_qs}"
        return web.json_response({"error": {"message": f"denied: {seen} {dict(h)}"}}, status=401)
    if fault in ("500body", "429body"):
        status = int(fault[:3])
        return web.json_response({"error": {"message": f"fault {fault}"}}, status=status)
    if fault in ("500", "429"):
        return web.Response(status=int(fault), body=b"")
    if fault == "noheaders":
        await asyncio.sleep(60)
    if fault == "json200":
        return web.json_response({"choices": [{"text": "hello"}]})

    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    st.open += 1
    try:
        return await _stream(
            request, resp, st, i, n, chat, pt, t0, d, fault, recv_ns, writes, written
        )
    finally:
        st.open -= 1


async def _stream(
    request: web.Request,
    resp: web.StreamResponse,
    st: State,
    i: int,
    n: int,
    chat: bool,
    pt: int,
    t0: float,
    d: float,
    fault: str,
    recv_ns: int,
    writes: list[int],
    written: list[int],
) -> web.StreamResponse:
    usage = st.usage
    if usage == "continuous":  # vLLM sends a role chunk with completion_tokens 0 first
        await resp.write(_chunk(i, "", 0, pt, chat))
    due = recv_ns / 1e9 + t0
    sent = 0
    k = 0
    while sent < n:
        now = time.perf_counter()
        if due > now:
            await asyncio.sleep(due - now)
        step = min(st.per_chunk, n - sent)
        sent += step
        text = "tok " * step
        if fault == "giant" and k == 0:
            data = GIANT  # built once: building 8 MB per request stalls a loaded machine
        else:
            data = _chunk(i, text, sent if usage == "continuous" else None, pt, chat)
        if fault == "weird":
            data = b": keep-alive\r\n\r\nevent: message\r\nid: 7\r\n" + data.replace(b"\n", b"\r\n")
            if k == 1:  # the JSON split over two data: lines
                js = data.split(b"data: ", 1)[1].strip()
                cut = js.index(b",")
                data = b"data: " + js[: cut + 1] + b"\r\ndata:" + js[cut + 1 :] + b"\r\n\r\n"
        if fault == "malformed":
            data = b"garbage line without colon\n: comment\ndata\nretry: x\n\n" + data
        if fault == "nonjson" and k == 1:
            data = b"data: hello world\n\n"
        if fault == "errorobj" and k == 1:
            data = b'data: {"error": {"message": "boom", "code": 500}}\n\n'
        writes.append(time.perf_counter_ns())
        await resp.write(data)
        written.append(time.perf_counter_ns())
        k += 1
        if fault in ("reset", "stall") and k == 2:
            if fault == "stall":
                await asyncio.sleep(60)
            _reset(request)
            return resp
        due += d
    if fault in UNTRUSTED:
        await resp.write(_untrusted_end(fault, n, pt))
    elif usage in ("final", "continuous"):
        await resp.write(_usage_only(n, pt))
    if fault != "noend":
        await resp.write(b"data: [DONE]\n\n")
    if fault == "resetafterdone":
        await asyncio.sleep(0.05)
        _reset(request)
        return resp
    await resp.write_eof()
    return resp


async def metrics(request: web.Request) -> web.Response:
    """A vLLM-style /metrics: requests running = streams open right now (for telemetry)."""
    st: State = request.app["state"]
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0",model_name="fake"}} {float(st.open)}\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="fake"} 0.0\n'
    )
    return web.Response(text=text, content_type="text/plain")


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def truth(request: web.Request) -> web.Response:
    return web.json_response(request.app["state"].truth)


async def log(request: web.Request) -> web.Response:
    return web.json_response(request.app["state"].log)


async def stats(request: web.Request) -> web.Response:
    return web.json_response({"closed_idle": request.app["state"].closed_idle})


async def main(args: argparse.Namespace) -> None:
    app = web.Application(client_max_size=64 << 20)
    app["state"] = State(args)
    app.router.add_post("/v1/chat/completions", handle)
    app.router.add_post("/v1/completions", handle)
    app.router.add_get("/health", health)
    app.router.add_get("/truth", truth)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/log", log)
    app.router.add_get("/stats", stats)
    await serve(app, args.port)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--t0-ms", default="20")
    ap.add_argument("--d-ms", default="5")
    ap.add_argument("--usage", default="none", choices=["none", "final", "continuous"])
    ap.add_argument("--per-chunk", type=int, default=1)
    ap.add_argument("--faults", default="")
    ap.add_argument("--reject-optional", action="store_true")
    ap.add_argument("--idle-close-ms", type=float, default=0.0)
    ap.add_argument("--slots", type=int, default=0, help="requests served at once (0: any)")
    try:
        asyncio.run(main(ap.parse_args()))
    except KeyboardInterrupt:
        sys.exit(0)
