"""The prefix cache of one engine: cached prompt prefixes per group, shared by reference.

Why its own module: which blocks of a prompt are already cached, who holds them and which
unreferenced chain goes first (LRU) is a job of its own; the KV pool (`kvpool.py`) only counts
the blocks these calls move. A group's chain is whole blocks (hash-chained, as vLLM's), so a
prefix hit is `min(prefix, prompt − 1) // block_size` blocks at most.

A session's turns share one chain of their own (groups from `SESSION_GROUPS`, `sessions.py`):
a turn publishes its whole prompt (the next turn begins with it), and a turn whose reply the
next turn carries (an odd group) also its reply's blocks when it finishes, as vLLM caches every
full block, generated ones included. Other groups publish their shared prefix only.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from phaselens.sim.seq import Seq

SESSION_GROUPS: Final = 1 << 40  # prefix groups from here on are sessions' own chains


class PrefixCache:
    """Cached chains (blocks per group), their reference counts, and the unreferenced ones in
    least-recently-released order (evictable: counted free by the pool, reclaimed on demand)."""

    __slots__ = ("bs", "cached", "enabled", "evictable", "refs")

    def __init__(self, block_size: int, enabled: bool) -> None:
        self.bs = block_size
        self.enabled = enabled
        self.cached: dict[int, int] = {}  # group -> blocks in its chain
        self.refs: dict[int, int] = {}  # group -> sequences holding the chain
        self.evictable: OrderedDict[int, int] = OrderedDict()  # unreferenced chains, LRU first

    def has_evictable(self) -> bool:
        return bool(self.evictable)

    def evict_oldest(self) -> int:
        """Drop the least recently released unreferenced chain; returns its blocks."""
        g, nb = self.evictable.popitem(last=False)
        del self.cached[g]
        return nb

    def unref(self, group: int) -> int:
        """One holder fewer; returns the chain's blocks when it became unreferenced (else 0)."""
        ref = self.refs[group] - 1
        self.refs[group] = ref
        if ref:
            return 0
        nb = self.cached[group]
        self.evictable[group] = nb
        return nb

    def hit(self, seq: Seq) -> int:
        """Give a fresh sequence the cached blocks of its group's chain (sets `seq.shared` and
        `seq.computed`); returns the blocks revived from evictable (0 if the chain was held)."""
        if seq.group < 0 or not self.enabled or seq.computed:
            return 0
        full = min(seq.prefix, seq.prompt - 1) // self.bs
        hit = min(full, self.cached.get(seq.group, 0))
        if hit <= 0:
            return 0
        g = seq.group
        revived = 0
        if self.refs.get(g, 0) == 0:
            revived = self.evictable.pop(g)
            self.refs[g] = 1
        else:
            self.refs[g] += 1
        seq.shared = hit
        seq.computed = hit * self.bs
        return revived

    def publish(self, seq: Seq) -> None:
        """After a prefill, its full prefix blocks become (or extend) the group's cached chain.

        The blocks move from the sequence's private count to the group's, so KV in use does not
        change; a later request with a longer prompt extends a chain a shorter one started.
        """
        if not self.enabled:
            return
        g = seq.group
        full = (seq.prompt if g >= SESSION_GROUPS else min(seq.prefix, seq.prompt - 1)) // self.bs
        self._grow(seq, full)

    def keep_reply(self, seq: Seq, computed: int) -> None:
        """A session turn finished with `computed` tokens in KV: its full blocks, the reply's
        included, become its chain when the next turn carries this reply (an odd group)."""
        if self.enabled and seq.group & 1:
            self._grow(seq, computed // self.bs)

    def _grow(self, seq: Seq, full: int) -> None:
        cached = self.cached.get(seq.group, 0)
        if full <= cached or seq.shared < cached:
            return  # nothing new, or it did not build on the whole cached chain
        if cached == 0:
            self.refs[seq.group] = self.refs.get(seq.group, 0) + 1
        self.cached[seq.group] = full
        seq.shared = full
