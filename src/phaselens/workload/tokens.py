"""Token counts of real text: the model's tokenizer, the server's, or an estimate said to be one.

Why a counter passed in, not chosen here: the planner (this layer) must not speak HTTP to a
server, but `phaselens run` knows its target and can offer the server's `/tokenize` (built in
the driver); `plan` offers a local `--tokenizer` file or nothing. Whatever counts, the planned
lengths are the counted ones, and the server's `usage.prompt_tokens` stays the truth in the
record. The estimate is about 4 characters a token (English text in the usual BPEs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from phaselens.errors import InputError
from phaselens.types import I64

CHARS_PER_TOKEN = 4.0  # the estimate without a tokenizer (docs/workload.md)


@dataclass(frozen=True, slots=True)
class Counter:
    """Counts the tokens of each text (no special tokens); `how` goes into the manifest."""

    how: str  # tokenizer | server | estimated
    count: Callable[[Sequence[str]], I64]
    source: str = ""  # the tokenizer file or the server URL


def estimate(texts: Sequence[str]) -> I64:
    """About CHARS_PER_TOKEN characters a token; at least 1 for a non-empty text."""
    n = np.fromiter(map(len, texts), np.int64, len(texts))
    out: I64 = np.where(n > 0, np.maximum(np.rint(n / CHARS_PER_TOKEN), 1), 0).astype(np.int64)
    return out


ESTIMATE = Counter("estimated", estimate)


def load_tokenizer(path: str) -> Any:
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


def tokenizer_counter(path: str) -> Counter:
    """Exact counts with a local tokenizer file (batched: the library encodes in parallel)."""
    tok = load_tokenizer(path)

    def count(texts: Sequence[str]) -> I64:
        out = np.zeros(len(texts), np.int64)
        for a in range(0, len(texts), 4096):
            enc = tok.encode_batch(list(texts[a : a + 4096]), add_special_tokens=False)
            out[a : a + len(enc)] = [len(e.ids) for e in enc]
        return out

    return Counter("tokenizer", count, str(path))
