"""Chained block hashes of prompt text: shared prefixes found, and text anonymized keeping them.

Why block hashes (the Mooncake trace format's idea): each message's text is cut into blocks
of `BLOCK_CHARS` characters (its role in the first one's hash, so "system: X" and "user: X"
differ), block k's id is the hash of block k and the id of block k-1, so two requests share
block ids exactly as far as they share a prefix (to the block; a message shared whole is
shared whole). Anonymizing replaces each block by synthetic words derived from its id only:
the same length in characters, the same shared prefixes, none of the original text.
Deterministic: no random state, the same log anonymizes the same anywhere.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence

import numpy as np

from phaselens.types import I32, I64, Message

BLOCK_CHARS = 64  # about 16 tokens of English text (a vLLM KV block)

_WORD_TEXT = """
time year people way day man thing woman life child world school state family student group
country problem hand part place case week company system program question work government
number night point home water room mother area money story fact month lot right study book
eye job word business issue side kind head house service friend father power hour game line
end member law car city community name president team minute idea kid body information back
parent face others level office door health person art war history party result change
morning reason research girl guy moment air teacher force education foot boy age policy
music market sense nation plan college interest death experience effect use class control
care field development role effort rate heart drug show leader light voice wife police mind
price report decision son view relationship town road arm difference value building action
model season society tax director position player record paper space ground form event
official matter center couple site project activity star table need court oil situation cost
industry figure street image phone data picture practice piece land product doctor wall
patient worker news test movie north love support technology step baby computer type
attention film tree source organization hair window evidence population site training bank
rule science
"""
_WORDS = tuple(_WORD_TEXT.split())


def blocks(conv: Sequence[Message]) -> list[tuple[bytes, int]]:
    """(chained id, characters) of each block; blocks restart at each message (its role is in
    its first block's hash), so a message shared whole anonymizes whole."""
    out, prev = [], b""
    for role, content in conv:
        head = f"\x00{role}\x00".encode()
        for a in range(0, max(len(content), 1), BLOCK_CHARS):
            piece = content[a : a + BLOCK_CHARS]
            prev = hashlib.blake2b(
                prev + head + piece.encode("utf-8", "surrogatepass"), digest_size=16
            ).digest()
            out.append((prev, len(piece)))
            head = b""
    return out


def block_prefixes(convs: Sequence[Sequence[Message]], input_tokens: I64) -> tuple[I32, I64]:
    """Shared prefix per request, as `traces.mooncake_prefixes` from Mooncake hash ids: a
    block is shared when at least two requests hold its id; a request's prefix is its leading
    run of shared blocks, in tokens pro rata to its characters; its group is its first id's."""
    all_blocks = [blocks(c) for c in convs]
    counts = Counter(b for bl in all_blocks for b, _ in bl)
    dense: dict[bytes, int] = {}
    group = np.full(len(convs), -1, np.int32)
    tokens = np.zeros(len(convs), np.int64)
    for i, bl in enumerate(all_blocks):
        k, chars = 0, 0
        while k < len(bl) and counts[bl[k][0]] >= 2:
            chars += bl[k][1]
            k += 1
        if k:
            group[i] = dense.setdefault(bl[0][0], len(dense))
            size = sum(n for _, n in bl)
            tokens[i] = min(round(int(input_tokens[i]) * chars / max(size, 1)), input_tokens[i])
    return group, tokens


def _synthetic_block(block_id: bytes, n: int) -> str:
    """`n` characters of words chosen by the block's id (its hash stream), ending in a space
    so that blocks join as words."""
    out: list[str] = []
    size, k = 0, 0
    while size < n:
        d = hashlib.blake2b(block_id + k.to_bytes(4, "little"), digest_size=64).digest()
        for b in d:
            w = _WORDS[b % len(_WORDS)]
            out.append(w)
            size += len(w) + 1
        k += 1
    return (" ".join(out)[: n - 1] + " ")[-n:]


def anonymize_conv(conv: Sequence[Message], cache: dict[bytes, str]) -> tuple[Message, ...]:
    """The conversation with every content replaced, character for character in length."""
    bl = iter(blocks(conv))
    out = []
    for role, content in conv:
        parts = []
        for _ in range(0, max(len(content), 1), BLOCK_CHARS):
            bid, n = next(bl)
            text = cache.get(bid)
            if text is None:
                text = cache[bid] = _synthetic_block(bid, BLOCK_CHARS)
            parts.append(text[:n])
        out.append((role, "".join(parts)))
    return tuple(out)


def anonymize_pool(
    pool: Sequence[Sequence[Message]],
) -> tuple[tuple[Message, ...], ...]:
    """Every conversation anonymized (one cache: shared blocks are built once)."""
    cache: dict[bytes, str] = {}
    return tuple(anonymize_conv(c, cache) for c in pool)
