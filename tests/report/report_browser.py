"""Open an HTML file in a real headless Chromium over the DevTools protocol.

Why: "the report works" means a browser ran its JavaScript without errors and drew the plots.
We start Debian's `chromium` with networking features off, attach over a websocket on
127.0.0.1, collect uncaught exceptions and console errors, evaluate a probe expression and take
a full-page screenshot.

Usage by hand: `python tests/report/report_browser.py report.html shot.png`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-sync",
    "--disable-extensions",
    "--no-first-run",
    "--no-default-browser-check",
    "--metrics-recording-only",
    "--mute-audio",
    "--hide-scrollbars",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
]


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


@dataclass
class PageResult:
    errors: list[str] = field(default_factory=list)  # uncaught exceptions + console errors
    console: list[str] = field(default_factory=list)
    probe: Any = None
    screenshot: Path | None = None


class _Cdp:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse, result: PageResult) -> None:
        self.ws = ws
        self.result = result
        self.next_id = 0
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: dict[str, asyncio.Event] = {}

    async def pump(self) -> None:
        async for msg in self.ws:
            data = json.loads(msg.data)
            if "id" in data and data["id"] in self.pending:
                self.pending.pop(data["id"]).set_result(data)
                continue
            method = data.get("method", "")
            params = data.get("params", {})
            if method == "Runtime.exceptionThrown":
                d = params.get("exceptionDetails", {})
                desc = d.get("exception", {}).get("description") or d.get("text")
                self.result.errors.append(f"Uncaught: {desc}")
            elif method == "Runtime.consoleAPICalled":
                text = " ".join(
                    str(a.get("value", a.get("description", ""))) for a in params.get("args", [])
                )
                self.result.console.append(f"{params.get('type')}: {text}")
                if params.get("type") in ("error", "assert"):
                    self.result.errors.append(f"console.{params.get('type')}: {text}")
            elif method == "Log.entryAdded":
                e = params.get("entry", {})
                self.result.console.append(f"log {e.get('level')}: {e.get('text')}")
                if e.get("level") == "error":
                    self.result.errors.append(f"log: {e.get('text')} {e.get('url', '')}")
            if method in self.events:
                self.events[method].set()

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = fut
        await self.ws.send_str(json.dumps({"id": self.next_id, "method": method, "params": params}))
        data = await asyncio.wait_for(fut, 60)
        if "error" in data:
            raise RuntimeError(f"{method}: {data['error']}")
        return dict(data.get("result", {}))


async def _run(
    html: Path,
    screenshot: Path | None,
    probe: str,
    ready: str,
    width: int,
    timeout: float,
    clip: str | None,
) -> PageResult:
    exe = find_chromium()
    if exe is None:
        raise RuntimeError("chromium not found: run scripts/install_browser.sh")
    result = PageResult()
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group: we end it and all its helpers
        )
        try:
            assert proc.stderr is not None
            port = None
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while port is None:
                line = await asyncio.wait_for(
                    loop.run_in_executor(None, proc.stderr.readline),
                    max(1.0, deadline - loop.time()),
                )
                if not line and proc.poll() is not None:
                    raise RuntimeError(f"chromium exited with {proc.returncode}")
                m = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
                if m:
                    port = int(m.group(1))
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{port}/json/list") as resp:
                    targets = await resp.json()
                page = next(t for t in targets if t.get("type") == "page")
                async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                    cdp = _Cdp(ws, result)
                    cdp.events["Page.loadEventFired"] = asyncio.Event()
                    pump = asyncio.create_task(cdp.pump())
                    await cdp.call("Runtime.enable")
                    await cdp.call("Log.enable")
                    await cdp.call("Page.enable")
                    await cdp.call(
                        "Emulation.setDeviceMetricsOverride",
                        width=width,
                        height=900,
                        deviceScaleFactor=1,
                        mobile=False,
                    )
                    await cdp.call("Page.navigate", url=html.resolve().as_uri())
                    await asyncio.wait_for(cdp.events["Page.loadEventFired"].wait(), timeout)
                    while loop.time() < deadline:
                        r = await cdp.call("Runtime.evaluate", expression=ready, returnByValue=True)
                        if r.get("result", {}).get("value") is True:
                            break
                        await asyncio.sleep(0.2)
                    else:
                        result.errors.append(f"timeout waiting for {ready!r}")
                    r = await cdp.call("Runtime.evaluate", expression=probe, returnByValue=True)
                    result.probe = r.get("result", {}).get("value")
                    if screenshot is not None:
                        kw: dict[str, Any] = {"format": "png", "captureBeyondViewport": True}
                        if clip:
                            r = await cdp.call(
                                "Runtime.evaluate",
                                returnByValue=True,
                                expression=f"(() => {{ const r = document.querySelector("
                                f"{json.dumps(clip)}).getBoundingClientRect(); return "
                                "{x: r.x + scrollX, y: r.y + scrollY, width: r.width, "
                                "height: r.height, scale: 1}; })()",
                            )
                            kw["clip"] = r["result"]["value"]
                        shot = await cdp.call("Page.captureScreenshot", **kw)
                        screenshot.write_bytes(base64.b64decode(shot["data"]))
                        result.screenshot = screenshot
                    await asyncio.sleep(0.3)  # let late console messages arrive
                    pump.cancel()
        finally:
            _stop(proc)
    return result


def _stop(proc: subprocess.Popen[str]) -> None:
    """End the browser we started and its helper processes (its own process group)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    time.sleep(0.2)  # helpers exit after the browser; let them release the profile dir


# Default probe: per plot div, how many traces and points the browser actually drew.
PROBE = """JSON.stringify(Array.from(document.querySelectorAll('.js-plotly-plot')).map(g => ({
  id: g.id,
  traces: (g._fullData || []).length,
  points: (g._fullData || []).reduce(
    (n, t) => n + ((t.x && t.x.length) || (t.y && t.y.length) || 0), 0)
})))"""
READY = "window.__phaselensReady === true"


def open_page(
    html: Path,
    screenshot: Path | None = None,
    probe: str = PROBE,
    ready: str = READY,
    width: int = 1400,
    timeout: float = 90.0,
    clip: str | None = None,
) -> PageResult:
    """Load `html`, wait until `ready` is true, evaluate `probe`, screenshot (`clip`: a CSS
    selector to capture only that element)."""
    return asyncio.run(_run(html, screenshot, probe, ready, width, timeout, clip))


if __name__ == "__main__":
    res = open_page(
        Path(sys.argv[1]),
        Path(sys.argv[2]) if len(sys.argv) > 2 else None,
        clip=sys.argv[3] if len(sys.argv) > 3 else None,
    )
    print(json.dumps({"errors": res.errors, "probe": res.probe}, indent=1))
    sys.exit(1 if res.errors else 0)
