#!/usr/bin/env python3
"""A small OpenAI-compatible streaming server around transformers' continuous batching.

Why: the GPU end-to-end check (scripts/gpu_e2e.sh) needs a real LLM server on a machine with no
network, where vLLM cannot be installed; transformers (>= 5) ships a continuous-batching engine
(`model.init_continuous_batching()` -> `ContinuousBatchingManager`: paged KV cache, a FIFO
scheduler admitting requests into every step, chunked prefill under a token budget). This file
only puts HTTP around it; it batches nothing itself.

    python scripts/tfserve.py --model DIR [--random-weights] --port 8000 --name tf-8b \
        [--device cuda] [--dtype bfloat16] [--max-seqs 64] [--max-batch-tokens 2048]

Serves
  POST /v1/completions, /v1/chat/completions   SSE streaming as vLLM does it: one chunk per engine
       step's new tokens; `stream_options.include_usage` (a last chunk with `choices: []` and the
       usage) and `continuous_usage_stats` (cumulative usage on every chunk); `ignore_eos`
       honoured; `min_tokens` honoured with `ignore_eos` (then the output is exactly max_tokens)
       and refused (400) without it; non-streaming requests answered whole.
  GET /v1/models, /health, /metrics (vLLM's names: vllm:num_requests_running, _waiting,
       vllm:kv_cache_usage_perc, vllm:prompt_tokens_total, vllm:generation_tokens_total,
       vllm:request_success_total, vllm:num_preemptions_total).
  With --profile-dir DIR only: vLLM's profiler API (see StepProfiler), so `phaselens run
       --profile ... --profile-dir DIR` drives it as it drives vLLM:
       POST /start_profile {"profile_prefix", "max_iterations", "delay_iterations"},
       POST /stop_profile, and GET /openapi.json listing the routes (how phaselens tells it is
       vLLM's convention). Each engine step then runs inside vLLM's annotation
       `execute_context_{Rc}({ctx tokens})_generation_{Rg}({gen tokens})` and the trace is
       DIR/{prefix}_rank0.{time_ns}.pt.trace.json.gz, written after max_iterations steps.
Bad requests get vLLM's error shape {"error": {"message", "type", "code"}} with 400/404.

Tokenizer (`--tokenizer`): `hf` (the model folder's tokenizer.json, through AutoTokenizer) or
`word` (the default without one): one token per whitespace-separated word, id = 3 + crc32(word)
mod (vocab - 3); a generated id decodes to one word of a fixed list, with its leading space, so
re-tokenizing the output gives the same count. Either way `usage` counts the ids the model was
fed and the ids it generated: phaselens' prompts (common English words) are then exactly their
planned length. `--random-weights` builds the model from its config.json with random
(initializer_range) weights on the device, in `--dtype`: no checkpoint, no download.

Needs torch, transformers >= 5.17, aiohttp, prometheus-client (all on the GPU image).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger("tfserve")

# Output words of the `word` tokenizer: plain ASCII, one token each.
_OUT_WORDS = ("the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as")


class WordTokenizer:
    """One id per whitespace-separated word (see the module docstring)."""

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < 64:
            raise ValueError(f"vocab_size {vocab_size} is too small for the word tokenizer")
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [3 + zlib.crc32(w.encode("utf-8")) % (self.vocab_size - 3) for w in text.split()]

    def chat(self, messages: list[dict[str, Any]]) -> list[int]:
        ids: list[int] = []
        for m in messages:
            ids.append(1)  # role marker
            ids += self.encode(_content_text(m.get("content")))
        ids.append(2)  # assistant marker
        return ids

    def decode_one(self, token: int) -> str:
        return " " + _OUT_WORDS[token % len(_OUT_WORDS)]


class HFTokenizer:
    """The model folder's own tokenizer (tokenizer.json, chat template)."""

    def __init__(self, path: Path) -> None:
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(str(path))

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def chat(self, messages: list[dict[str, Any]]) -> list[int]:
        msgs = [
            {"role": str(m.get("role", "user")), "content": _content_text(m.get("content"))}
            for m in messages
        ]
        out = self.tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        if isinstance(out, dict) or hasattr(out, "keys"):  # a BatchEncoding in some versions
            out = out["input_ids"]
        return [int(t) for t in out]

    def decode_one(self, token: int) -> str:
        text = str(self.tok.decode([token], skip_special_tokens=False))
        return text or " "  # every token reaches the client as text (an empty piece is no chunk)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


# ------------------------------------------------------------------------------ profiler
class StepProfiler:
    """vLLM's profiler API (`--profile-dir`) around transformers' continuous-batching steps.

    Why: a real GPU's holes between and inside engine steps need a real torch.profiler trace
    whose steps carry the engine's own batch annotation; tfserve stands in for vLLM where vLLM
    cannot be installed, so it offers the same API with the same semantics (vLLM 0.3x
    `profiler/wrapper.py`): `start` profiles `max_iterations` steps after skipping
    `delay_iterations`, stops by itself and writes the trace with
    `tensorboard_trace_handler(dir, worker_name=f"{prefix}_rank0", use_gzip=True)`; `stop`
    stops a profiler still running (or cancels one not yet started), waits for the file, and
    clears the session (a second `start` before `stop` is refused, as vLLM's guard does).

    Threads: the HTTP handlers only post requests under the lock. The continuous-batching
    thread does all profiler work, in `on_loop` (before every `prepare_next_batch`, which its
    loop calls at least every 0.1 s, idle or not) and `on_step` (around every
    `_generation_step`), because torch's profiler belongs to the thread that started it.
    """

    def __init__(self, out_dir: Path, device_is_cuda: bool) -> None:
        self.dir = out_dir
        self.cuda = device_is_cuda
        self.lock = threading.Lock()
        self.session = False  # from a start until its stop (vLLM's guard)
        self.pending: dict[str, Any] | None = None  # a start the engine thread has not begun
        self.stop_wanted = False
        self.prof: Any = None  # the running torch.profiler.profile
        self.steps_left = 0  # of this session's max_iterations (0: until stop)
        self.steps_done = 0
        self.idle = threading.Event()  # set: no profiler running or about to run
        self.idle.set()
        self.last: dict[str, Any] = {}  # the last session: prefix, steps, file or error

    # HTTP side ------------------------------------------------------------------------------
    def request_start(self, prefix: str, max_iterations: int, delay: int) -> str:
        """'' when accepted, else why not."""
        with self.lock:
            if self.session:
                return "a profiling session is already open: POST /stop_profile first"
            self.session, self.stop_wanted = True, False
            self.pending = {"prefix": prefix, "max": max_iterations, "delay": delay}
            self.idle.clear()
        return ""

    def request_stop(self) -> None:
        with self.lock:
            if self.session:
                self.stop_wanted = True

    def close_session(self) -> None:
        with self.lock:
            self.session = False

    # engine thread -------------------------------------------------------------------------
    def on_loop(self) -> None:
        """Before each scheduling pass: a stop request, or a start whose delay has passed."""
        with self.lock:
            stop, pend = self.stop_wanted, self.pending
            self.stop_wanted = False
            if stop:
                self.pending = None
        if stop:
            if self.prof is not None:
                self._finish("stopped by /stop_profile")
            self.idle.set()
        elif pend is not None and pend["delay"] <= 0 and self.prof is None:
            self._begin(pend)

    def on_step(self, step: Any, bp: Any, model: Any) -> Any:
        """One engine step: annotated and counted while a profiler runs."""
        if self.prof is None:
            with self.lock:
                if self.pending is not None and self.pending["delay"] > 0:
                    self.pending["delay"] -= 1
            return step(bp, model)
        import torch

        with torch.profiler.record_function(step_label(bp)):
            out = step(bp, model)
        self.prof.step()
        self.steps_done += 1
        self.steps_left -= 1
        if self.steps_left == 0:  # max_iterations reached (a count of 0 runs until stop)
            self._finish("max_iterations reached")
            self.idle.set()
        return out

    def _begin(self, pend: dict[str, Any]) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler

        with self.lock:
            self.pending = None
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        handler = tensorboard_trace_handler(
            str(self.dir), worker_name=f"{pend['prefix']}_rank0", use_gzip=True
        )
        self.last = {"prefix": pend["prefix"], "max_iterations": pend["max"], "steps": 0}
        try:
            if self.cuda:
                torch.cuda.synchronize()
            self.prof = profile(activities=acts, on_trace_ready=handler)
            self.prof.start()
        except Exception as e:  # never take the engine down for a profile
            self.prof = None
            self.last["error"] = f"{type(e).__name__}: {e}"
            log.warning("tfserve: profiler did not start: %s", self.last["error"])
            self.idle.set()
            return
        self.steps_left, self.steps_done = pend["max"], 0

    def _finish(self, why: str) -> None:
        import torch

        prof, self.prof = self.prof, None
        before = set(os.listdir(self.dir)) if self.dir.is_dir() else set()
        t0 = time.perf_counter()
        try:
            if self.cuda:
                torch.cuda.synchronize()  # the last step's kernels inside the trace
            prof.stop()  # on_trace_ready writes the file
        except Exception as e:
            self.last["error"] = f"{type(e).__name__}: {e}"
            log.warning("tfserve: profiler stop/export failed: %s", self.last["error"])
        new = sorted(set(os.listdir(self.dir)) - before) if self.dir.is_dir() else []
        self.last.update(
            steps=self.steps_done, why=why, files=new, export_s=round(time.perf_counter() - t0, 2)
        )
        log.warning("tfserve: profile %s", json.dumps(self.last))


def step_batch(bp: Any) -> list[Any]:
    """The FutureRequestStates of the batch `prepare_next_batch` just built (sync IOs hold them
    themselves; async IOs in the current host/device pair)."""
    io = bp.inputs_and_outputs
    pairs = getattr(io, "io_pairs", None)
    host = pairs[io.current_pair].host_io if pairs is not None else io
    return list(getattr(host, "requests_in_batch", None) or [])


def step_counts(batch: list[Any]) -> tuple[int, int, int, int]:
    """(context requests, their query tokens, generation requests, their query tokens), as vLLM
    counts them: a request is in context (prefill) while this step's query starts inside its
    prompt, i.e. its past length (position_offset, already advanced by this step's query when
    the step runs) minus the query is below the prompt length. The scheduler's status is no
    guide: it marks a request DECODING as soon as its last prefill chunk is scheduled."""
    rc = ct = rg = gt = 0
    for fs in batch:
        q = int(fs.query_length)
        st = fs.state
        past = int(st.position_offset) - q
        if past < len(st.initial_tokens):
            rc, ct = rc + 1, ct + q
        else:
            rg, gt = rg + 1, gt + q
    return rc, ct, rg, gt


def step_label(bp: Any) -> str:
    try:
        rc, ct, rg, gt = step_counts(step_batch(bp))
    except Exception:  # a transformers version with other internals: still one step
        rc = ct = rg = gt = 0
    return f"execute_context_{rc}({ct})_generation_{rg}({gt})"


def install_step_hooks(prof: StepProfiler) -> None:
    """Wrap ContinuousBatchProcessor's scheduling pass and step (class-wide, before the engine
    starts) so the engine thread calls the profiler."""
    from transformers.generation.continuous_batching.continuous_api import (
        ContinuousBatchProcessor as CBP,
    )

    prepare, step = CBP.prepare_next_batch, CBP._generation_step

    def prepare_next_batch(self: Any) -> bool:
        prof.on_loop()
        return bool(prepare(self))

    def _generation_step(self: Any, model: Any) -> None:
        prof.on_step(step, self, model)

    CBP.prepare_next_batch = prepare_next_batch  # type: ignore[method-assign]
    CBP._generation_step = _generation_step  # type: ignore[method-assign]


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _error(message: str, status: int) -> web.Response:
    kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(body, status=status)


@dataclass
class Parsed:
    """One validated request."""

    chat: bool
    ids: list[int]
    max_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    continuous_usage: bool


@dataclass
class Stats:
    """What /metrics reports besides the scheduler's own state."""

    inflight: dict[str, int] = field(default_factory=dict)  # request id -> tokens streamed


class Server:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.name: str = args.name
        self.started = time.time()
        self.manager: Any = None
        self.tok: Any = None
        self.max_model_len = 0
        self.eos: int | list[int] | None = None
        self.stats = Stats()
        disable_created_metrics()  # type: ignore[no-untyped-call]  # no *_created samples
        reg = self.registry = CollectorRegistry()
        lab = ["model_name"]
        self.m_prompt = Counter(
            "vllm:prompt_tokens", "Prefill tokens processed.", lab, registry=reg
        )
        self.m_gen = Counter("vllm:generation_tokens", "Generated tokens.", lab, registry=reg)
        self.m_ok = Counter(
            "vllm:request_success", "Finished requests.", [*lab, "finished_reason"], registry=reg
        )
        self.m_preempt = Counter("vllm:num_preemptions", "Preemptions.", lab, registry=reg)
        self.m_running = Gauge("vllm:num_requests_running", "Running.", lab, registry=reg)
        self.m_waiting = Gauge("vllm:num_requests_waiting", "Waiting.", lab, registry=reg)
        self.m_kv = Gauge("vllm:kv_cache_usage_perc", "KV cache usage (0-1).", lab, registry=reg)
        for c in (self.m_prompt, self.m_gen, self.m_preempt):
            c.labels(self.name)
        self.m_running.labels(self.name).set_function(lambda: self._state()[0])
        self.m_waiting.labels(self.name).set_function(lambda: self._state()[1])
        self.m_kv.labels(self.name).set_function(lambda: self._state()[2])
        self.info: dict[str, Any] = {}
        self.profiler: StepProfiler | None = None
        self.paths: list[str] = []  # the served routes, for /openapi.json

    # --------------------------------------------------------------------- engine
    def load(self) -> None:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
        from transformers.generation import ContinuousBatchingConfig

        a = self.args
        dtype = getattr(torch, a.dtype)
        device = torch.device(a.device)
        cfg = AutoConfig.from_pretrained(a.model)
        t0 = time.perf_counter()
        if a.random_weights or not any(Path(a.model).glob("*.safetensors")):
            torch.manual_seed(a.seed)
            with device:
                model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        else:
            model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype).to(device)
        model.eval()
        load_s = time.perf_counter() - t0
        vocab = int(cfg.vocab_size)
        tok_kind = a.tokenizer
        if tok_kind == "auto":
            tok_kind = "hf" if (Path(a.model) / "tokenizer.json").is_file() else "word"
        self.tok = HFTokenizer(Path(a.model)) if tok_kind == "hf" else WordTokenizer(vocab)
        self.max_model_len = int(a.max_model_len or getattr(cfg, "max_position_embeddings", 4096))
        eos = getattr(cfg, "eos_token_id", None)
        self.eos = eos if eos is not None else -1

        gen = GenerationConfig(
            do_sample=False, max_new_tokens=a.default_max_tokens, eos_token_id=self.eos
        )
        cb_kwargs: dict[str, Any] = {
            "max_requests_per_batch": a.max_seqs,
            "max_batch_tokens": a.max_batch_tokens,
            "block_size": a.block_size,
            "allow_block_sharing": False,  # phaselens' prompts share nothing unless planned to
        }
        if a.num_blocks:
            cb_kwargs["num_blocks"] = a.num_blocks
        if a.max_memory_percent:
            cb_kwargs["max_memory_percent"] = a.max_memory_percent
        if a.cuda_graphs != "auto":
            cb_kwargs["use_cuda_graph"] = a.cuda_graphs == "on"
        cbc = ContinuousBatchingConfig(**cb_kwargs)
        if a.profile_dir:
            Path(a.profile_dir).mkdir(parents=True, exist_ok=True)
            self.profiler = StepProfiler(Path(a.profile_dir), device.type == "cuda")
            install_step_hooks(self.profiler)
        t1 = time.perf_counter()
        mgr = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cbc)
        warm_err = ""
        if a.warmup:
            try:
                mgr.warmup()
            except Exception as e:  # CPU, or a version without graphs: serve without it
                warm_err = f"{type(e).__name__}: {e}"
        mgr.start()
        self.manager = mgr
        bp = self._wait_processor(60.0)
        cache = getattr(bp, "cache", None)
        self.info = {
            "model": a.model,
            "random_weights": bool(a.random_weights),
            "device": str(device),
            "device_name": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "dtype": a.dtype,
            "tokenizer": tok_kind,
            "vocab_size": vocab,
            "params": sum(p.numel() for p in model.parameters()),
            "attn_implementation": str(model.config._attn_implementation),
            "max_model_len": self.max_model_len,
            "max_seqs": a.max_seqs,
            "max_batch_tokens": int(getattr(cache, "max_batch_tokens", a.max_batch_tokens)),
            "block_size": int(getattr(cache, "block_size", a.block_size)),
            "num_blocks": int(getattr(cache, "num_blocks", 0) or 0),
            "kv_capacity_tokens": int(getattr(cache, "num_blocks", 0) or 0)
            * int(getattr(cache, "block_size", a.block_size)),
            "load_s": round(load_s, 2),
            "init_warmup_s": round(time.perf_counter() - t1, 2),
            "warmup_error": warm_err,
            "profile_dir": str(a.profile_dir or ""),
            "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
        }
        log.warning("tfserve: engine ready %s", json.dumps(self.info))

    def _wait_processor(self, timeout_s: float) -> Any:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            bp = getattr(self.manager, "batch_processor", None)
            if bp is not None and getattr(bp, "scheduler", None) is not None:
                return bp
            if not self.manager.is_running():
                raise RuntimeError("the continuous-batching thread stopped during startup")
            time.sleep(0.05)
        return None

    def _state(self) -> tuple[float, float, float]:
        """(running, waiting, KV usage 0-1) from the scheduler and cache; a request streamed
        nothing yet counts as waiting where the scheduler cannot be read."""
        bp: Any = getattr(self.manager, "batch_processor", None)
        sched: Any = getattr(bp, "scheduler", None)
        try:
            running = float(len(sched.active_requests))
            waiting = float(len(sched.waiting_requests) + self.manager.input_queue.qsize())
        except Exception:
            toks = list(self.stats.inflight.values())
            running = float(sum(1 for n in toks if n > 0))
            waiting = float(len(toks)) - running
        try:
            cache = bp.cache
            kv = 1.0 - cache.get_num_free_blocks() / max(1, cache.num_blocks)
        except Exception:
            kv = 0.0
        return running, waiting, kv

    # --------------------------------------------------------------------- HTTP
    def parse(self, body: Any, chat: bool) -> Parsed:
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        model = body.get("model", self.name)
        if model != self.name:
            raise BadRequest(f"The model `{model}` does not exist.", 404)
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise BadRequest("messages must be a non-empty list")
            ids = self.tok.chat(msgs)
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                prompt = prompt[0]
            if not isinstance(prompt, str):
                raise BadRequest("prompt must be a string")
            ids = self.tok.encode(prompt)
        if not ids:
            raise BadRequest("the prompt is empty")
        mt = body.get("max_tokens", body.get("max_completion_tokens"))
        if mt is None:
            mt = max(1, min(self.args.default_max_tokens, self.max_model_len - len(ids)))
        if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
            raise BadRequest("max_tokens must be at least 1, got " + json.dumps(mt))
        if len(ids) + mt > self.max_model_len:
            raise BadRequest(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {len(ids) + mt} tokens ({len(ids)} in the messages, {mt} in the "
                "completion). Please reduce the length of the messages or completion."
            )
        n = body.get("n", 1)
        if n != 1:
            raise BadRequest("n > 1 is not supported by this server")
        temp = body.get("temperature", 0)
        if not isinstance(temp, (int, float)) or temp != 0:
            raise BadRequest("only greedy decoding (temperature 0) is supported by this server")
        ignore_eos = bool(body.get("ignore_eos", False))
        mn = body.get("min_tokens", 0) or 0
        if not isinstance(mn, int) or isinstance(mn, bool) or mn < 0:
            raise BadRequest("min_tokens must be a non-negative integer")
        if mn > mt:
            raise BadRequest(f"min_tokens ({mn}) must be less than or equal to max_tokens ({mt})")
        if mn > 0 and not ignore_eos:
            raise BadRequest("min_tokens is only supported together with ignore_eos here")
        so = body.get("stream_options") or {}
        if not isinstance(so, dict):
            raise BadRequest("stream_options must be an object")
        stream = bool(body.get("stream", False))
        if so and not stream:
            raise BadRequest("Stream options can only be defined when `stream=True`.")
        return Parsed(
            chat=chat,
            ids=ids,
            max_tokens=mt,
            ignore_eos=ignore_eos,
            stream=stream,
            include_usage=bool(so.get("include_usage", False)),
            continuous_usage=bool(so.get("continuous_usage_stats", False)),
        )

    async def completions(self, req: web.Request) -> web.StreamResponse:
        return await self._generate(req, chat=False)

    async def chat(self, req: web.Request) -> web.StreamResponse:
        return await self._generate(req, chat=True)

    async def _generate(self, req: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await req.json()
        except (ValueError, UnicodeDecodeError):
            return _error("the request body is not JSON", 400)
        try:
            p = self.parse(body, chat)
        except BadRequest as e:
            return _error(str(e), e.status)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        outq: asyncio.Queue[Any] = asyncio.Queue()
        mgr = self.manager
        mgr.register_result_handler(rid, outq.put_nowait)
        self.stats.inflight[rid] = 0
        mgr.add_request(
            p.ids,
            request_id=rid,
            max_new_tokens=p.max_tokens,
            streaming=True,
            eos_token_id=-1 if p.ignore_eos else self.eos,
        )
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        resp: web.StreamResponse | None = None
        sent = 0
        text_parts: list[str] = []
        finish = "length"
        try:
            if p.stream:
                resp = web.StreamResponse(
                    headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
                )
                await resp.prepare(req)
                if chat:
                    first = {"index": 0, "delta": {"role": "assistant", "content": ""}}
                    await self._send(resp, rid, obj, created, first, None)
            while True:
                out = await outq.get()
                if out.error is not None:
                    raise RuntimeError(str(out.error))
                toks = list(out.generated_tokens)
                new = toks[sent:]
                done = out.is_finished()
                if new:
                    if sent == 0:
                        self.m_prompt.labels(self.name).inc(len(p.ids))
                    self.m_gen.labels(self.name).inc(len(new))
                    piece = "".join(self.tok.decode_one(int(t)) for t in new)
                    sent = len(toks)
                    self.stats.inflight[rid] = sent
                    if p.stream and resp is not None:
                        usage = self._usage(p, sent) if p.continuous_usage else None
                        await self._send(resp, rid, obj, created, _choice(chat, piece), usage)
                    else:
                        text_parts.append(piece)
                if done:
                    if not p.ignore_eos and toks and _is_eos(toks[-1], self.eos):
                        finish = "stop"
                    break
            self.m_ok.labels(self.name, finish).inc()
            if p.stream and resp is not None:
                last = _choice(chat, "", finish)
                usage = self._usage(p, sent) if p.continuous_usage else None
                await self._send(resp, rid, obj, created, last, usage)
                if p.include_usage:
                    await self._chunk(resp, rid, obj, created, [], self._usage(p, sent))
                await resp.write(b"data: [DONE]\n\n")
                await resp.write_eof()
                return resp
            text = "".join(text_parts)
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            return web.json_response(
                {
                    "id": rid,
                    "object": "chat.completion" if chat else "text_completion",
                    "created": created,
                    "model": self.name,
                    "choices": [choice],
                    "usage": self._usage(p, sent),
                }
            )
        except (ConnectionResetError, asyncio.CancelledError):
            mgr.cancel_request(rid)  # the client went away: free its slot and KV blocks
            raise
        except RuntimeError as e:
            if resp is None:
                return _error(f"generation failed: {e}", 500)
            err = {"error": {"message": f"generation failed: {e}", "code": 500}}
            await resp.write(b"data: " + json.dumps(err).encode() + b"\n\n")
            return resp
        finally:
            self.stats.inflight.pop(rid, None)

    def _usage(self, p: Parsed, n: int) -> dict[str, int]:
        return {"prompt_tokens": len(p.ids), "completion_tokens": n, "total_tokens": len(p.ids) + n}

    async def _send(
        self,
        resp: web.StreamResponse,
        rid: str,
        obj: str,
        created: int,
        choice: dict[str, Any],
        usage: dict[str, int] | None,
    ) -> None:
        await self._chunk(resp, rid, obj, created, [choice], usage)

    async def _chunk(
        self,
        resp: web.StreamResponse,
        rid: str,
        obj: str,
        created: int,
        choices: list[dict[str, Any]],
        usage: dict[str, int] | None,
    ) -> None:
        ev: dict[str, Any] = {
            "id": rid,
            "object": obj,
            "created": created,
            "model": self.name,
            "choices": choices,
        }
        if usage is not None:
            ev["usage"] = usage
        await resp.write(b"data: " + json.dumps(ev, separators=(",", ":")).encode() + b"\n\n")

    async def models(self, _req: web.Request) -> web.Response:
        card = {
            "id": self.name,
            "object": "model",
            "created": int(self.started),
            "owned_by": "tfserve",
            "root": self.args.model,
            "max_model_len": self.max_model_len,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def health(self, _req: web.Request) -> web.Response:
        ok = self.manager is not None and self.manager.is_running()
        return web.Response(status=200 if ok else 503)

    async def engine_info(self, _req: web.Request) -> web.Response:
        return web.json_response(self.info)

    async def openapi(self, _req: web.Request) -> web.Response:
        """Only the paths (what phaselens reads to recognise vLLM's profiler API)."""
        doc = {
            "openapi": "3.0.0",
            "info": {"title": "tfserve", "version": "0"},
            "paths": {p: {} for p in self.paths},
        }
        return web.json_response(doc)

    async def start_profile(self, req: web.Request) -> web.Response:
        assert self.profiler is not None  # (routed only with --profile-dir)
        body: Any = {}
        if req.can_read_body:
            try:
                body = await req.json()
            except (ValueError, UnicodeDecodeError):
                return _error("the request body is not JSON", 400)
        if not isinstance(body, dict):
            return _error("the request body must be a JSON object", 400)
        prefix = body.get("profile_prefix") or "tfserve"
        if not isinstance(prefix, str) or "/" in prefix or prefix.startswith("."):
            return _error("profile_prefix must be a file name prefix", 400)
        counts = []
        for key in ("max_iterations", "delay_iterations"):
            v = body.get(key, 0) or 0
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                return _error(f"{key} must be a non-negative integer", 400)
            counts.append(v)
        why = self.profiler.request_start(prefix, counts[0], counts[1])
        if why:
            return _error(why, 400)
        return web.Response(status=200)

    async def stop_profile(self, _req: web.Request) -> web.Response:
        """Stop (if still running), wait until the trace is written, close the session."""
        prof = self.profiler
        assert prof is not None
        prof.request_stop()
        end = time.monotonic() + 300.0
        while not prof.idle.is_set() and time.monotonic() < end:
            if not self.manager.is_running():
                break
            await asyncio.sleep(0.05)
        prof.close_session()
        return web.json_response(prof.last)

    async def metrics(self, _req: web.Request) -> web.Response:
        data = generate_latest(self.registry)
        return web.Response(body=data, headers={"Content-Type": CONTENT_TYPE_LATEST})


def _choice(chat: bool, text: str, finish: str | None = None) -> dict[str, Any]:
    if chat:
        delta = {"content": text} if text or finish is None else {}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}


def _is_eos(token: int, eos: int | list[int] | None) -> bool:
    if isinstance(eos, int):
        return token == eos
    return eos is not None and token in eos


def make_app(server: Server) -> web.Application:
    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/completions", server.completions)
    app.router.add_post("/v1/chat/completions", server.chat)
    app.router.add_get("/v1/models", server.models)
    app.router.add_get("/health", server.health)
    app.router.add_get("/metrics", server.metrics)
    app.router.add_get("/engine", server.engine_info)
    if server.profiler is not None:
        app.router.add_post("/start_profile", server.start_profile)
        app.router.add_post("/stop_profile", server.stop_profile)
        app.router.add_get("/openapi.json", server.openapi)
        server.paths = sorted({r.resource.canonical for r in app.router.routes() if r.resource})
    return app


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="folder with config.json (and weights)")
    ap.add_argument("--random-weights", action="store_true", help="random init from config.json")
    ap.add_argument("--name", default="tf", help="served model name")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--tokenizer", default="auto", choices=("auto", "hf", "word"))
    ap.add_argument("--max-seqs", type=int, default=64, help="max_requests_per_batch")
    ap.add_argument("--max-batch-tokens", type=int, default=2048, help="token budget per step")
    ap.add_argument("--block-size", type=int, default=256, help="KV block size (tokens)")
    ap.add_argument("--num-blocks", type=int, default=0, help="KV blocks (0: from free memory)")
    ap.add_argument("--max-memory-percent", type=float, default=0.0)
    ap.add_argument("--max-model-len", type=int, default=0)
    ap.add_argument("--default-max-tokens", type=int, default=256)
    ap.add_argument("--cuda-graphs", default="auto", choices=("auto", "on", "off"))
    ap.add_argument("--no-warmup", dest="warmup", action="store_false")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's)")
    ap.add_argument(
        "--profile-dir",
        default="",
        help="serve vLLM's profiler API (/start_profile, /stop_profile); traces go here",
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    server = Server(args)
    server.load()
    with contextlib.suppress(KeyboardInterrupt):
        web.run_app(make_app(server), host=args.host, port=args.port, print=None)
    # SIGTERM/SIGINT end run_app; the engine's thread is not a daemon: stop it, then leave
    # even if it hangs (hard stop fails what is still in flight).
    with contextlib.suppress(Exception):
        server.manager.stop(block=True, timeout=10, hard_stop=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
