"""Prompts of a planned token length, built just before each request is sent.

Why: the server's prefill cost depends on the exact input length, and shared-prefix groups must
share their prefix text byte for byte so that prefix caches can hit. Without a tokenizer the
text is built from common English words that are one token each (with their leading space) in
the usual BPE vocabularies, so the length is close; the server's `usage.prompt_tokens` is then
recorded as the truth. With `--tokenizer PATH` (a local `tokenizer.json`, `tokenizers` package)
the text is adjusted until it encodes to exactly the planned count.

Every random choice comes from a numpy Generator seeded by (seed, purpose, id), so the same
schedule and seed give the same prompts in any process and in any order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from phaselens.errors import InputError
from phaselens.types import PlannedRequest

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
_SALT_PREFIX, _SALT_UNIQUE = 1, 2


class PromptMaker:
    """Builds the prompt text of a planned request (deterministic in seed and request id)."""

    def __init__(self, seed: int, tokenizer_path: str | None = None) -> None:
        self.seed = seed
        self._vocab = np.array(VOCAB, dtype=object)
        self._tok: Any = _load_tokenizer(tokenizer_path) if tokenizer_path else None
        self._prefix_cache: dict[tuple[int, int], str] = {}

    def _words(self, salt: int, key: int, n: int) -> str:
        if n <= 0:
            return ""
        rng = np.random.default_rng([self.seed, salt, key])
        idx = rng.integers(0, len(VOCAB), size=n)
        return " " + " ".join(self._vocab[idx].tolist())

    def prefix(self, group: int, tokens: int) -> str:
        """The shared text of a prefix group: identical for every request of the group."""
        key = (group, tokens)
        text = self._prefix_cache.get(key)
        if text is None:
            text = self._words(_SALT_PREFIX, group, tokens)
            if self._tok is not None:
                text = self._fit(text, tokens, _SALT_PREFIX, group)
            self._prefix_cache[key] = text
        return text

    def prompt(self, req: PlannedRequest) -> str:
        """The full prompt: the group's prefix (if any), then text unique to this request."""
        n_prefix = min(req.prefix_tokens, req.input_tokens) if req.prefix_group >= 0 else 0
        head = self.prefix(req.prefix_group, n_prefix) if n_prefix else ""
        n_rest = req.input_tokens - n_prefix
        # The request id as the first word keeps prompts of one group distinct right after the
        # shared part, so a prefix cache cannot reuse more than the planned prefix.
        tail = self._words(_SALT_UNIQUE, req.id, n_rest - 1)
        rest = f" {req.id}{tail}" if n_rest > 0 else ""
        text = (head + rest).lstrip(" ")
        if self._tok is None:
            return text
        return head.lstrip(" ") + self._fit_tail(head, rest, req.input_tokens, req.id)

    def count(self, text: str) -> int:
        """Tokens in `text` by the loaded tokenizer (no special tokens); -1 without one."""
        if self._tok is None:
            return -1
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def _fit(self, text: str, n: int, salt: int, key: int) -> str:
        """Trim or extend word text until it encodes to exactly `n` tokens (or gets close)."""
        rng = np.random.default_rng([self.seed, salt, key, 7])
        for _ in range(64):
            have = self.count(text.lstrip(" "))
            if have == n:
                break
            if have > n:
                ids = self._tok.encode(text.lstrip(" "), add_special_tokens=False).ids[:n]
                text = " " + str(self._tok.decode(ids))
            else:
                text += " " + " ".join(self._vocab[rng.integers(0, len(VOCAB), n - have)].tolist())
        return text

    def _fit_tail(self, head: str, rest: str, n: int, key: int) -> str:
        rng = np.random.default_rng([self.seed, _SALT_UNIQUE, key, 7])
        full = head.lstrip(" ")
        for _ in range(64):
            have = self.count(full + rest)
            if have == n or not rest:
                break
            if have > n:
                words = rest.split(" ")
                cut = max(2, len(words) - (have - n))
                if cut == len(words):
                    break
                rest = " ".join(words[:cut])
            else:
                rest += " " + " ".join(self._vocab[rng.integers(0, len(VOCAB), n - have)].tolist())
        return rest if full else rest.lstrip(" ")


def _load_tokenizer(path: str) -> Any:
    """A `tokenizers` tokenizer from a local tokenizer.json (or a directory holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise InputError(f"--tokenizer: {path}: expected a tokenizer.json file or its directory")
    try:
        from tokenizers import Tokenizer  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise InputError(
            "--tokenizer: the 'tokenizers' package is not installed "
            "(pip install 'phaselens[tokenizer]')"
        ) from None
    try:
        return Tokenizer.from_file(str(p))
    except Exception as e:  # the library raises a bare Exception on a bad file
        raise InputError(f"{p}: not a tokenizers JSON file ({e})") from None
