"""The KV cache of one engine, in blocks: in use, evictable (cached prefixes nobody holds), free.

Why its own module: every admission, decode step, finish and preemption moves blocks; keeping
the counting in one place (with the prefix cache's chains as the only evictable blocks) is what
makes "KV in use" mean the same in the step log, the telemetry and the fast-forward.
"""

from __future__ import annotations

from phaselens.sim.prefix import PrefixCache
from phaselens.sim.seq import Seq


class KvPool:
    """Block counts of one engine's KV cache; `prefix` holds the cached chains."""

    __slots__ = ("bs", "commits", "committed", "evictable", "prefix", "total", "used")

    def __init__(self, kv_tokens: int, block_size: int, prefix_cache: bool) -> None:
        self.bs = block_size
        self.total = kv_tokens // block_size
        self.used = 0  # blocks held by sequences and by referenced prefix chains
        self.evictable = 0  # blocks of unreferenced prefix chains (free, as vLLM counts usage)
        self.prefix = PrefixCache(block_size, prefix_cache)
        # policy.kv_full = queue: the blocks each admitted sequence may hold at most (its own,
        # beyond the prefix blocks it shares), promised until it releases its KV
        self.committed = 0
        self.commits: dict[int, int] = {}

    def fits_whole(self, blocks: int) -> bool:
        """Would `blocks` more promised blocks fit beside every promise made and every prefix
        chain held? (Each running sequence's KV stays within its promise plus the chains it
        holds, so a sequence admitted this way never finds its next block taken.)"""
        pc = self.prefix
        held = sum(pc.cached.get(g, 0) for g, r in pc.refs.items() if r > 0)
        return self.committed + held + blocks <= self.total

    def commit(self, rid: int, blocks: int) -> None:
        self.commits[rid] = blocks
        self.committed += blocks

    def free(self) -> int:
        return self.total - self.used - self.evictable

    def ensure_free(self, n: int) -> bool:
        """Make `n` blocks free, evicting unreferenced prefix-cache chains (LRU) if needed."""
        while self.total - self.used - self.evictable < n and self.prefix.has_evictable():
            self.evictable -= self.prefix.evict_oldest()
        return self.total - self.used - self.evictable >= n

    def release(self, seq: Seq, computed: int) -> None:
        """Free a sequence's KV (finish, preemption, hand-off); drop its prefix-chain reference."""
        bs = self.bs
        self.used -= (computed + bs - 1) // bs - seq.shared
        if self.commits:
            self.committed -= self.commits.pop(seq.rid, 0)
        if seq.shared:
            nb = self.prefix.unref(seq.group)
            self.used -= nb
            self.evictable += nb
            seq.shared = 0

    def prefix_hit(self, seq: Seq) -> None:
        """Reuse the cached prefix blocks of the sequence's group (`PrefixCache.hit`)."""
        revived = self.prefix.hit(seq)
        if revived:
            self.evictable -= revived
            self.used += revived
