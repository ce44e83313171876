"""The server's own token counts (`/tokenize`) for planning real text, at plan time.

Why: without a local tokenizer file the server is the best judge of its own lengths; llama.cpp
(`{"content"}` -> `{"tokens": [...]}`) and vLLM (`{"model", "prompt"}` -> `{"count", ...}`)
both have the endpoint, so one body carries both spellings. Each distinct text is asked once
over one keep-alive connection. A server without it (404, an error, no numbers) yields None:
the caller then estimates and says so in the manifest.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Sequence
from urllib.parse import urlsplit

import numpy as np

from phaselens.errors import InputError
from phaselens.types import I64
from phaselens.workload.tokens import Counter

TIMEOUT_S = 30.0


class _Client:
    def __init__(self, base: str, model: str) -> None:
        u = urlsplit(base)
        self.host = u.hostname or "localhost"
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.https = u.scheme == "https"
        self.model = model
        self.conn: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        if self.conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            self.conn = cls(self.host, self.port, timeout=TIMEOUT_S)
        return self.conn

    def count(self, text: str) -> int | None:
        body = json.dumps(
            {
                "content": text,
                "prompt": text,
                "model": self.model,
                "add_special": False,
                "add_special_tokens": False,
            }
        ).encode()
        for attempt in (0, 1):  # one reconnect: a keep-alive the server closed
            try:
                c = self._connect()
                c.request("POST", "/tokenize", body, {"Content-Type": "application/json"})
                r = c.getresponse()
                data = r.read()
                break
            except (OSError, http.client.HTTPException):
                self.conn = None
                if attempt:
                    return None
        if r.status != 200:
            return None
        try:
            obj = json.loads(data)
        except ValueError:
            return None
        if isinstance(obj, dict):
            n = obj.get("count")
            if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
                return n
            toks = obj.get("tokens")
            if isinstance(toks, list):
                return len(toks)
        return None


def server_counter(url: str, model: str) -> Counter | None:
    """A counter asking the server at `url` (any path: its host is used), or None when the
    server has no usable `/tokenize`."""
    client = _Client(url, model)
    if client.count("hello world") is None:
        return None

    def count(texts: Sequence[str]) -> I64:
        memo: dict[str, int] = {}
        out = np.zeros(len(texts), np.int64)
        for i, t in enumerate(texts):
            n = memo.get(t)
            if n is None:
                got = client.count(t)
                if got is None:
                    raise InputError(
                        f"{url}: /tokenize stopped answering while counting the prompts "
                        "(give --tokenizer, or retry)"
                    )
                n = memo[t] = got
            out[i] = n
        return out

    base = f"{'https' if client.https else 'http'}://{client.host}:{client.port}/tokenize"
    return Counter("server", count, base)
