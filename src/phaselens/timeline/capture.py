"""Profiling windows driven during a run: start, wait for the steps, stop, collect the files.

Why a thread beside the run: the engine's profiler is controlled over HTTP and a window waits
for the engine (its steps, then the trace being written), none of which may delay a request the
driver sends. The thread only calls the engine's profiler API and reads `--profile-dir`.

Every window ends with one manifest entry (`profile.windows[]`): requested steps and delay, the
run times of the start and stop calls, what the engine answered, and the trace files found —
copied (hard-linked where possible) into the run directory's `profile/`, so the run keeps its
evidence when the engine's directory is cleaned.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phaselens.timeline import engines
from phaselens.timeline.engines import Engine
from phaselens.timeline.windows import ALONE, ProfilePlan, Window

POLL_S = 0.2
SETTLE_S = 0.5  # a file must keep its size this long before it counts as written
# A window bounded by a time (`until_ns`: its stage's end) is stopped this long before it: the
# stop call reaches the engine's loop between two steps, after HTTP and a busy host's wake-up,
# and a step the engine starts before that is still recorded
STOP_LEAD_S = 0.3
WRITE_WAIT_S = 120.0  # after the stop call: longest wait for the engine to write its trace
PROFILE_DIR = "profile"  # inside the run directory


@dataclass(frozen=True, slots=True)
class Probe:
    """The `alone` window's one request: where it goes and how big it is."""

    url: str
    model: str
    endpoint: str  # "completions" | "chat"
    prompt_words: int
    max_tokens: int


@dataclass
class Capture:
    """The windows of one run against one engine (the first target URL)."""

    plan: ProfilePlan
    base: str
    engine: Engine
    profile_dir: Path
    run_dir: Path
    tag: str  # prefix of every trace file this run asks for
    now_ns: Callable[[], int]  # run time
    probe: Probe | None = None
    entries: list[dict[str, Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="profile-windows", daemon=True)
        self._thread.start()

    def finish(self) -> list[dict[str, Any]]:
        """End of the load: close an open window, mark the unreached ones, run `alone`; one
        manifest entry per window, in start order."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=WRITE_WAIT_S + engines.STOP_TIMEOUT_S + 30)
        done = {e["name"] for e in self.entries}
        for w in self.plan.windows:
            if w.name in done or w.name == ALONE:
                continue
            self.entries.append(
                {**_requested(w), "status": "not reached: the load ended before its time"}
            )
        alone = [w for w in self.plan.windows if w.name == ALONE]
        if alone:
            self.entries.append(self._window(alone[0], wait_until=None))
        order = {w.name: i for i, w in enumerate(self.plan.windows)}
        return [
            {"url": self.base, "engine": self.engine, **e}
            for e in sorted(self.entries, key=lambda e: order[e["name"]])
        ]

    def _loop(self) -> None:
        timed = [w for w in self.plan.windows if w.at_ns is not None]
        for i, w in enumerate(timed):
            assert w.at_ns is not None  # (timed windows only)
            while not self._stop.is_set() and self.now_ns() < w.at_ns:
                self._stop.wait(min(POLL_S, max(0.0, (w.at_ns - self.now_ns()) / 1e9)))
            if self._stop.is_set():
                return
            nxt = timed[i + 1].at_ns if i + 1 < len(timed) else None
            self.entries.append(self._window(w, wait_until=nxt))

    def _window(self, w: Window, wait_until: int | None) -> dict[str, Any]:
        prefix = f"{self.tag}-{w.name}"
        entry: dict[str, Any] = {**_requested(w), "prefix": prefix}
        before = set(_ours(self.profile_dir, prefix))
        entry["start_ns"] = self.now_ns()
        ans = engines.start(self.base, self.engine, prefix, w.steps, w.delay, str(self.profile_dir))
        # the engine answers between two steps, and a loaded one late: past a stage window's
        # stop time, the window is stopped at once (its steps may fall in the next stage)
        entry["start_done_ns"] = self.now_ns()
        entry["start_answer"] = ans.status
        if not ans.ok:
            entry["status"] = f"refused: HTTP {ans.status} {ans.text[:200]}".strip()
            return entry
        if w.name == ALONE and self.probe is not None:
            entry["request"] = _send_probe(self.probe, self.now_ns)
        deadline = time.monotonic() + w.max_s
        # run times to stop before, each with its lead: never overlap the next window, and a
        # stage window records that stage's steps only
        for run_ns, lead_s in ((wait_until, 1.0), (w.until_ns, STOP_LEAD_S)):
            if run_ns is not None:
                left_s = max(0.0, (run_ns - self.now_ns()) / 1e9 - lead_s)
                deadline = min(deadline, time.monotonic() + left_s)
        files = self._wait_files(prefix, before, deadline, stop_early=w.name != ALONE)
        entry["stop_ns"] = self.now_ns()
        # by itself: the engine ran its steps and wrote the trace before phaselens' deadline;
        # else the stop below cut it (fewer steps than requested: a slow or loaded engine)
        entry["ended"] = "by itself" if files else "at its deadline"
        stopped = engines.stop(self.base)
        entry["stop_done_ns"] = self.now_ns()  # the engine writes its trace before it answers
        entry["stop_answer"] = stopped.status
        if not files:
            files = self._wait_files(
                prefix, before, time.monotonic() + WRITE_WAIT_S, stop_early=False
            )
        entry["files"] = self._keep(files)
        entry["status"] = (
            "ok" if files else f"no trace file with prefix {prefix} in {self.profile_dir}"
        )
        return entry

    def _wait_files(
        self, prefix: str, before: set[Path], deadline: float, stop_early: bool
    ) -> list[Path]:
        """New trace files of this window once their size holds still (the engine wrote them)."""
        sizes: dict[Path, tuple[int, float]] = {}
        while time.monotonic() < deadline and not (stop_early and self._stop.is_set()):
            now = time.monotonic()
            found = [p for p in _ours(self.profile_dir, prefix) if p not in before]
            settled = []
            for p in found:
                try:
                    size = p.stat().st_size
                except OSError:
                    continue
                old = sizes.get(p)
                if old is None or old[0] != size:
                    sizes[p] = (size, now)
                elif size > 0 and now - old[1] >= SETTLE_S:
                    settled.append(p)
            if found and len(settled) == len(found):
                return sorted(settled)
            # never sleep past the deadline: a stage window's stop is due before its stage ends
            time.sleep(max(0.0, min(POLL_S, deadline - time.monotonic())))
        return []

    def _keep(self, files: list[Path]) -> list[dict[str, Any]]:
        """Hard-link (else copy) each file into the run's profile/; its entry."""
        dest_dir = self.run_dir / PROFILE_DIR
        dest_dir.mkdir(exist_ok=True)
        out = []
        for f in files:
            dest = dest_dir / f.name
            try:
                os.link(f, dest)
            except OSError:
                shutil.copyfile(f, dest)
            out.append(
                {"path": f"{PROFILE_DIR}/{f.name}", "source": str(f), "bytes": dest.stat().st_size}
            )
        return out


def _requested(w: Window) -> dict[str, Any]:
    return {
        "name": w.name,
        "stage": w.stage,
        "at_ns": w.at_ns,
        "until_ns": w.until_ns,
        "requested": {"steps": w.steps, "delay": w.delay, "max_s": w.max_s},
    }


def _ours(d: Path, prefix: str) -> list[Path]:
    """Trace files named by this window's prefix (vLLM `prefix_…`, SGLang `prefix-…`)."""
    try:
        names = os.listdir(d)
    except OSError:
        return []
    return [
        d / n
        for n in names
        if (n.startswith(prefix + "_") or n.startswith(prefix + "-") or n.startswith(prefix + "."))
        and (n.endswith(".json") or n.endswith(".json.gz"))
    ]


def _send_probe(p: Probe, now_ns: Callable[[], int]) -> dict[str, Any]:
    """The alone window's one request (not a planned request: it has no record, only this
    entry): sent, first byte back, end, on the run clock."""
    prompt = " ".join(["hello"] * max(1, p.prompt_words))
    path = "/v1/completions" if p.endpoint == "completions" else "/v1/chat/completions"
    body: dict[str, Any] = {"model": p.model, "max_tokens": p.max_tokens, "stream": True}
    if p.endpoint == "completions":
        body["prompt"] = prompt
    else:
        body["messages"] = [{"role": "user", "content": prompt}]
    body["ignore_eos"] = True
    req = urllib.request.Request(
        p.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    out: dict[str, Any] = {
        "sent_ns": now_ns(),
        "prompt_words": p.prompt_words,
        "max_tokens": p.max_tokens,
    }
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            first = True
            for line in r:
                if first and line.startswith(b"data:"):
                    out["first_token_ns"] = now_ns()
                    first = False
            out["status"] = int(r.status)
    except (OSError, ValueError) as e:
        out["status"] = 0
        out["error"] = f"{type(e).__name__}: {e}"[:200]
    out["end_ns"] = now_ns()
    return out
