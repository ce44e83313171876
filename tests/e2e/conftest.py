"""Session fixtures that run the real engines (llama.cpp's llama-server, vLLM's CPU build).

Why real engines: the driver's numbers must agree with what a real server did, and only a real
server streams, batches and counts the way production ones do. The engines are built by
`scripts/engines/install.sh` into a cache outside the clone; `make test` runs it first.

Both engines start in background threads as soon as the first e2e test needs either, so vLLM's
~30-50 s startup overlaps the llama.cpp tests. A missing install FAILS the test with the command
to run (a silently skipped e2e suite proves nothing); `PHASELENS_SKIP_E2E=1` skips it on purpose.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Served model names: distinct per engine so a two-model run can route by name, and so a request
# that reached the wrong engine fails loudly (vLLM answers 404 to an unknown model).
LLAMACPP_MODEL = "tiny-llamacpp"
VLLM_MODEL = "tiny-vllm"
PARALLEL = 16  # llama.cpp slots (-np) and vLLM --max-num-seqs
# vLLM runs with its torch profiler configured (docs/timeline.md): the /start_profile router
# exists only then; nothing is recorded until a test calls it. One directory per pytest process.
VLLM_PROFILE_DIR = Path(tempfile.gettempdir()) / f"phaselens-e2e-vllm-traces-{os.getpid()}"
VLLM_PROFILER = {
    "profiler": "torch",
    "torch_profiler_dir": str(VLLM_PROFILE_DIR),
    "ignore_frontend": True,  # the engine core's steps only (the frontend ignores step windows)
    "torch_profiler_with_stack": False,
}


def _load_engines() -> ModuleType:
    """scripts/engines/engines.py is a standalone script; load it by path, not via sys.path."""
    path = ROOT / "scripts" / "engines" / "engines.py"
    spec = importlib.util.spec_from_file_location("phaselens_engines_helper", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


engines = _load_engines()


def _require(kinds: tuple[str, ...]) -> None:
    if os.environ.get("PHASELENS_SKIP_E2E") == "1":
        pytest.skip("PHASELENS_SKIP_E2E=1")
    gone = engines.missing(kinds)
    if gone:
        pytest.fail(
            "real engines are not installed: "
            + "; ".join(gone)
            + f" (cache {engines.engines_dir()}). Run `make engines` "
            "(bash scripts/engines/install.sh), or set PHASELENS_SKIP_E2E=1 to skip.",
            pytrace=False,
        )


class _External:
    """An engine this session did not start (PHASELENS_E2E_LLAMACPP_URL / _VLLM_URL); it must
    serve the model names above: `engines.py start vllm --name tiny-vllm --ctx 1024`."""

    def __init__(self, kind: str, url: str, model: str) -> None:
        self.kind, self.url, self.model = kind, url, model
        self.log_path = Path("/dev/null")

    def alive(self) -> bool:
        return True

    def log_tail(self) -> str:
        return ""


class _Launcher:
    """Starts each engine once, in the background, and hands it out when a test needs it."""

    def __init__(self, log_dir: Path | None = None) -> None:
        self.log_dir = log_dir  # None: the engines cache's logs/ (outlives pytest's tmp dirs)
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="engine-start")
        self.futures: dict[str, Future[Any]] = {}

    def launch(self, kind: str) -> None:
        external = os.environ.get(f"PHASELENS_E2E_{kind.upper()}_URL")
        if kind in self.futures or external or engines.missing((kind,)):
            return
        model = LLAMACPP_MODEL if kind == "llamacpp" else VLLM_MODEL
        extra: tuple[str, ...] = ()
        if kind == "vllm":
            VLLM_PROFILE_DIR.mkdir(parents=True, exist_ok=True)
            extra = ("--profiler-config", json.dumps(VLLM_PROFILER))
        self.futures[kind] = self.pool.submit(
            engines.start,
            kind,
            model=model,
            size="tiny",
            parallel=PARALLEL,
            ctx=1024,
            threads=2,
            kv_cache_gib=1,
            timeout_s=300.0,
            log_dir=self.log_dir,
            extra_args=extra,
        )

    def get(self, kind: str) -> Any:
        ext = os.environ.get(f"PHASELENS_E2E_{kind.upper()}_URL")
        if ext:  # an engine started by hand (engines.py start ...): fast test iterations
            model = LLAMACPP_MODEL if kind == "llamacpp" else VLLM_MODEL
            return _External(kind, ext.rstrip("/"), model)
        _require((kind,))
        self.launch(kind)
        try:
            eng = self.futures[kind].result()
        except Exception as e:  # start() already stopped it and put the log tail in the message
            pytest.fail(f"{kind} did not start: {e}", pytrace=False)
        if not eng.alive():
            pytest.fail(f"{kind} died during the session; log {eng.log_path}:\n{eng.log_tail()}")
        return eng

    def close(self) -> None:
        for fut in self.futures.values():
            if fut.done() and fut.exception() is None:
                fut.result().stop()
            elif not fut.done():
                # still starting: wait for start() to finish (it stops the engine on failure)
                with contextlib.suppress(Exception):
                    fut.result(timeout=330).stop()
        self.pool.shutdown(wait=True)


@pytest.fixture(scope="session")
def _launcher() -> Iterator[_Launcher]:
    launcher = _Launcher()
    if os.environ.get("PHASELENS_SKIP_E2E") != "1":
        # start both at once: vLLM's slow startup overlaps whatever runs first
        launcher.launch("vllm")
        launcher.launch("llamacpp")
    yield launcher
    launcher.close()


@pytest.fixture(scope="session")
def llamacpp(_launcher: _Launcher) -> Any:
    """llama-server --cont-batching --metrics -np 16 on the tiny model, served as LLAMACPP_MODEL."""
    return _launcher.get("llamacpp")


@pytest.fixture(scope="session")
def vllm(_launcher: _Launcher) -> Any:
    """vLLM CPU OpenAI server (max-num-seqs 16, 1 GiB KV cache), served as VLLM_MODEL."""
    return _launcher.get("vllm")


@pytest.fixture(params=["llamacpp", "vllm"])
def engine(request: pytest.FixtureRequest) -> Any:
    """Each engine in turn."""
    return request.getfixturevalue(request.param)
