"""A request in flight on an engine, and where an engine reports what happens to requests.

Why its own module: the KV pool, the prefix cache, the admission policies and the step loop all
read and move the same per-request state; none of them owns it.
"""

from __future__ import annotations


class Seq:
    """One request in flight on an engine (mutable simulator state, never leaves the package)."""

    __slots__ = (
        "c0",
        "computed",
        "epoch",
        "g0",
        "gen",
        "group",
        "key",
        "out",
        "prefix",
        "prio",
        "prompt",
        "queue",
        "rid",
        "s0",
        "shared",
        "target",
    )

    def __init__(
        self,
        rid: int,
        prompt: int,
        out: int,
        key: tuple[int, int],
        group: int,
        prefix: int,
        prio: int = 0,
        queue: int = 0,
    ) -> None:
        self.rid = rid
        self.prompt = prompt
        self.out = out
        self.key = key  # waiting-queue order (policy-specific first element, then arrival order)
        self.group = group  # prefix group, -1 for none
        self.prefix = prefix  # leading tokens shared with the group
        self.prio = prio  # the request's priority (lower first), whatever the queue order
        self.queue = queue  # its class queue (`policy.queues`; 0 without)
        self.gen = 0  # tokens generated (delivered) so far
        self.computed = 0  # tokens whose KV is in the cache (valid while prefilling)
        self.target = prompt  # tokens to have in KV before the next token is sampled
        self.shared = 0  # prefix-cache blocks this sequence holds a reference to
        self.epoch = 0  # bumped on preemption: invalidates stale finish-heap entries
        self.s0 = 0  # decoding: first decode step index
        self.c0 = 0  # decoding: tokens in KV at step s0
        self.g0 = 0  # decoding: tokens generated before step s0


class Sink:
    """Where an engine reports what happened to requests (the cluster's: `sink.ClusterSink`).

    Methods of a class rather than callables in fields: compiled, the engine's calls to them
    are native calls with unboxed arguments."""

    def segment(self, rid: int, eng: int, a: int, b: int) -> None:
        """Request rid decoded on engine `eng` from step a to step b (its token segment)."""
        raise NotImplementedError

    def first_token(self, rid: int) -> None:
        """Request rid's first token, at the end of the current step."""
        raise NotImplementedError

    def prefill_start(self, rid: int) -> None:
        """Request rid first admitted, at the start of the current step."""
        raise NotImplementedError

    def finished(self, rid: int, tokens: int) -> None:
        """Request rid ended with `tokens` delivered, at the current step's end."""
        raise NotImplementedError

    def handoff(self, seq: Seq) -> None:
        """Prefill done on a prefill engine: send the KV on."""
        raise NotImplementedError
