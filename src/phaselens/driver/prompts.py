"""Prompts of a planned token length, built just before each request is sent.

Why: the server's prefill cost depends on the exact input length, and shared-prefix groups must
share their prefix text byte for byte so that prefix caches can hit. Without a tokenizer the
text is built from common English words that are one token each (with their leading space) in
the usual BPE vocabularies, so the length is close; the server's `usage.prompt_tokens` is then
recorded as the truth. With `--tokenizer PATH` (a local `tokenizer.json`, `tokenizers` package)
the text is adjusted until it encodes to exactly the planned count.

Real text (a prompt dataset, a replayed log: `Schedule.prompts`) does not pass through here:
the driver sends the row's messages as they are (`state.RunState.body`). Sessions of synthetic
text do: each turn's user message is `prompt` of that turn's row (its new tokens only), so the
history a later turn carries is byte for byte what was sent before (`history.py`).

Every random choice comes from a numpy Generator seeded by (seed, purpose, id), so the same
schedule and seed give the same prompts in any process and in any order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from phaselens.types import PlannedRequest
from phaselens.workload.tokens import load_tokenizer

# Common words that are single tokens with a leading space in GPT-2/Llama/Qwen style BPEs.
_WORDS = """
the of and to in is was for on that with as by at from his he it an were are which be this
has had not but their they one have first its new who also after been two her all more she
or time there other when into year can only over some most three we years out world part
between up many later city him made used then during about both such people where them than
state would through under well may while these early work four best game day each family
book found last long line own group life five did took any way same end high name well
school system team back service name great small area because war water following just set
music house order army old season local known since before general second several support
public form power found said three down left side story major became war what north south
east west music field number design home place order point world town game could will like
make very good three much even still make own place right old each
"""
VOCAB: tuple[str, ...] = tuple(dict.fromkeys(_WORDS.split()))
_SALT_PREFIX, _SALT_UNIQUE, _SALT_REPLY = 1, 2, 3
POOL = 1 << 14  # words per seeded pool; a request reads a window of it (longer ones wrap)
_STRIDE = 10007  # odd, so id -> window start is one-to-one modulo POOL


class PromptMaker:
    """Builds the prompt text of a planned request (deterministic in seed and request id).

    Seeded pools of random words (shared prefixes, the rest, stand-in replies); request i
    reads a window starting at i * 10007 mod 16384, so building a prompt costs a slice and a
    join, not a new random generator per request. Its own id is its first word after the
    shared prefix, so no two prompts share more than their planned prefix.
    """

    def __init__(self, seed: int, tokenizer_path: str | None = None) -> None:
        self.seed = seed
        self._tok: Any = load_tokenizer(tokenizer_path) if tokenizer_path else None
        self._pools = {salt: self._pool(salt) for salt in (_SALT_PREFIX, _SALT_UNIQUE, _SALT_REPLY)}
        self._prefix_cache: dict[tuple[int, int], str] = {}

    def _pool(self, salt: int) -> list[str]:
        rng = np.random.default_rng([self.seed, salt])
        words = [" " + VOCAB[i] for i in rng.integers(0, len(VOCAB), size=POOL).tolist()]
        return words + words  # doubled: every window of up to POOL words is one slice

    def _words(self, salt: int, key: int, n: int) -> str:
        """n words (each " word") from the window of `key` in pool `salt`."""
        if n <= 0:
            return ""
        pool = self._pools[salt]
        start = (key * _STRIDE) % POOL
        parts = []
        while n > 0:
            take = min(n, POOL)
            parts.append("".join(pool[start : start + take]))
            n -= take
        return "".join(parts)

    def prefix(self, group: int, tokens: int) -> str:
        """The shared text of a prefix group: identical for every request of the group."""
        key = (group, tokens)
        text = self._prefix_cache.get(key)
        if text is None:
            text = self._fit(lambda n: self._words(_SALT_PREFIX, group, n), "", tokens)
            self._prefix_cache[key] = text
        return text

    def prompt(self, req: PlannedRequest) -> str:
        """The full prompt: the group's prefix (if any), then text unique to this request."""
        n_prefix = min(req.prefix_tokens, req.input_tokens) if req.prefix_group >= 0 else 0
        head = self.prefix(req.prefix_group, n_prefix) if n_prefix else ""
        n_rest = req.input_tokens - n_prefix
        if n_rest <= 0:
            return head.lstrip(" ")
        tag = f" {req.id}"
        # With a tokenizer the id may be several tokens; when it does not fit, the window
        # (distinct per id) alone keeps prompts apart.
        if self._tok is not None and self.count(tag) >= n_rest:
            tag = ""

        def rest(n: int) -> str:
            return tag + self._words(_SALT_UNIQUE, req.id, n - 1 if tag else n)

        return (head + self._fit(rest, head, n_rest)).lstrip(" ")

    def reply(self, key: int, tokens: int) -> str:
        """A stand-in assistant reply of `tokens` tokens (a synthetic session's history when
        the server was forced to a length): its own pool, so it shares no text with prompts."""
        return self._fit(lambda n: self._words(_SALT_REPLY, key, n), "", tokens).lstrip(" ")

    def count(self, text: str) -> int:
        """Tokens in `text` by the loaded tokenizer (no special tokens); -1 without one."""
        if self._tok is None:
            return -1
        return len(self._tok.encode(text.lstrip(" "), add_special_tokens=False).ids)

    def _fit(self, make: Any, head: str, n: int) -> str:
        """make(k) with k chosen so that head + make(k) has head's tokens + n (tokenizer only).

        Words are about one token each, so a few corrections usually converge; otherwise the
        text is cut at the token level when that round-trips, else the closest is kept (the
        server's prompt_tokens is recorded as the truth anyway).
        """
        text: str = make(n)
        if self._tok is None:
            return text
        base = self.count(head) if head else 0
        k, best, best_err = n, text, None
        for _ in range(12):
            got = self.count(head + text) - base
            err = got - n
            if best_err is None or abs(err) < abs(best_err):
                best, best_err = text, err
            if err == 0 or k - err < 1:
                break
            k -= err
            text = make(k)
        if best_err:
            cut = self._truncate(head, make(max(k, n) + 2), base + n)
            if cut is not None:
                return cut
        return best

    def _truncate(self, head: str, text: str, n_total: int) -> str | None:
        """The tail of `head + text` cut to `n_total` tokens, if that round-trips exactly."""
        h = head.lstrip(" ")
        ids = self._tok.encode((head + text).lstrip(" "), add_special_tokens=False).ids
        if len(ids) < n_total:
            return None
        cand = str(self._tok.decode(ids[:n_total]))
        if not cand.startswith(h) or self.count(cand) != n_total:
            return None
        return cand[len(h) :] if h else cand
