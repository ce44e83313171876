"""Decode steps seen from the client: token gaps while the batch was known.

Why: requests served alone cannot tell a per-step cost from a per-sequence one (one sequence per
step makes them twins), so a light run says nothing about what batching costs — on a CPU engine
a second sequence can cost as much as the first. But a client that streams tokens sees more
than lone requests: between two consecutive tokens of a request, if every request that was
decoding then was decoding throughout and no request was waiting or prefilling, that gap is
exactly one decode-only step of those n sequences, with contexts the client knows (prompt plus
tokens received so far). Each such gap is one more linear equation of the roofline basis, with
n > 1 where requests overlapped: the per-sequence overhead then comes out of the same NNLS as
everything else, instead of a search over replays.

Observations are per request and batch size: the mean of that request's clean gaps at that n
(a TPOT-like row), so a long request does not outweigh a short one and one late client read
is averaged with its neighbours.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from phaselens.sim.deploy import Deployment
from phaselens.types import F64, I64, Schedule
from phaselens.whatif.basis import Isolated, Steps, concat, engine_hw, step_features

NEVER = np.iinfo(np.int64).max


@dataclass(frozen=True, slots=True)
class DecodeGaps:
    """Mean decode gap (s) of one request at one batch size, with the steps it averages."""

    basis: Isolated  # one observation per (request, batch size); none is a TTFT
    target: F64
    batch: I64  # decoding sequences in the observation's steps
    gaps: I64  # clean gaps averaged into each observation


def gaps_usable(deploy: Deployment) -> bool:
    """Clean gaps are single steps only on one continuous-batching engine with nothing else on
    its GPUs (co-located or P/D engines interleave steps the client cannot see)."""
    if len(deploy.engines) != 1:
        return False
    e = deploy.engines[0]
    return e.policy.type == "continuous" and e.role == "both"


def decode_gaps(
    requests: pl.DataFrame, sched: Schedule, deploy: Deployment, skip: I64
) -> DecodeGaps | None:
    """Clean decode gaps of every ok request not in `skip` (e.g. the lone ones, already used).

    A gap (t[j-1], t[j]) of request k is clean when each request decoding at any moment of it
    (first token ≤ t < end) decodes throughout it, each request sent but without its first
    token at any moment of it is so throughout (it waits: no arrival, no first token inside),
    requests wait only while every slot decodes (else one could be prefilling in this step),
    and both tokens arrived alone (one token in the chunk, and no other token of the request
    read at the same instant: tokens read together were late). The waiting count is a feature:
    engines that spend time on queued requests (c_wait) show it in these gaps. Request q's KV
    before the step holds its prompt plus the tokens it received by t[j-1], minus one (the
    token the step consumes is already counted in the prompt-plus-generated context).
    """
    if not gaps_usable(deploy) or sched.ids is None:
        return None
    e = deploy.engines[0]
    hw = engine_hw(deploy, e)
    slots = e.policy.max_num_seqs
    ar = deploy.cost.allreduce_latency_s
    f = requests.filter(pl.col("sent_ns").is_not_null())
    ids = f["id"].to_numpy().astype(np.int64)
    sent = f["sent_ns"].to_numpy().astype(np.int64)
    end = f["end_ns"].fill_null(NEVER).to_numpy().astype(np.int64)
    first = f["first_token_ns"].fill_null(-1).to_numpy().astype(np.int64)
    first = np.where(first < 0, end, first)  # never got a token: waiting until it ended
    toks = [np.asarray(t if t is not None else [], dtype=np.int64) for t in f["token_ns"]]
    cnts = [np.asarray(c if c is not None else [], dtype=np.int64) for c in f["token_counts"]]
    ok = (f["status"] == "ok").to_numpy()
    row_of = {int(i): r for r, i in enumerate(sched.ids.tolist())}
    prompt = np.asarray(
        [sched.input_tokens[row_of[int(i)]] if int(i) in row_of else 0 for i in ids],
        dtype=np.int64,
    )
    skipped = np.isin(ids, skip)
    feats: list[Steps] = []
    group: list[I64] = []
    weight: list[F64] = []
    target: list[float] = []
    batch: list[int] = []
    count: list[int] = []
    for k in np.flatnonzero(ok & ~skipped & (prompt > 0)):
        t, c = toks[k], cnts[k]
        if t.shape[0] < 2:
            continue
        a, b = t[:-1], t[1:]
        single = c[1:] == 1 if c.shape[0] == t.shape[0] else np.ones(a.shape[0], dtype=bool)
        # tokens read together (two SSE events in one read share its timestamp) were late: a
        # gap touching one measures the client's read, not a step (0 when both are in it)
        shared = np.zeros(t.shape[0], dtype=bool)
        same = t[1:] == t[:-1]
        shared[1:] |= same
        shared[:-1] |= same
        single &= ~shared[:-1] & ~shared[1:]
        dec_all = (first[None, :] <= a[:, None]) & (end[None, :] >= b[:, None])
        dec_any = (first[None, :] < b[:, None]) & (end[None, :] > a[:, None])
        wait_any = (sent[None, :] < b[:, None]) & (first[None, :] > a[:, None])
        wait_all = (sent[None, :] <= a[:, None]) & (first[None, :] >= b[:, None])
        n_all = dec_all.sum(axis=1)
        n_wait = wait_all.sum(axis=1)
        # waiting requests cannot be prefilling only when every slot is decoding
        clean = (
            single
            & (dec_all == dec_any).all(axis=1)
            & (wait_all == wait_any).all(axis=1)
            & ((n_wait == 0) | (n_all >= slots))
        )
        if not clean.any():
            continue
        dec = dec_all[clean]
        waits = n_wait[clean].astype(np.float64)
        a_c, gap = a[clean], (b[clean] - a[clean]).astype(np.float64) / 1e9
        n = dec.sum(axis=1).astype(np.int64)
        sum_ctx = np.zeros(a_c.shape[0])
        firsts = np.zeros(a_c.shape[0])
        for q in np.flatnonzero(dec.any(axis=0)):
            got = np.searchsorted(toks[q], a_c, side="right")
            sum_ctx += np.where(dec[:, q], prompt[q] + got - 1, 0)
            firsts += dec[:, q] & (got == 1)  # only its first token yet: its first decode step
        for nb in np.unique(n):
            sel = n == nb
            m = int(sel.sum())
            ones = np.full(m, float(nb))
            obs = len(target)
            feats.append(
                step_features(
                    e,
                    hw,
                    ones,
                    ones,
                    sum_ctx[sel] + nb,
                    sum_ctx[sel],
                    ones,
                    ar,
                    first=firsts[sel],
                    waiting=waits[sel],
                )
            )
            group.append(np.full(m, obs, dtype=np.int64))
            weight.append(np.full(m, 1.0 / m))
            target.append(float(gap[sel].mean()))
            batch.append(int(nb))
            count.append(m)
    if not target:
        return None
    n_obs = len(target)
    basis = Isolated(
        steps=concat(feats),
        group=np.concatenate(group),
        weight=np.concatenate(weight),
        is_ttft=np.zeros(n_obs, dtype=bool),
        fixed_obs=np.zeros(n_obs),
    )
    return DecodeGaps(
        basis,
        np.asarray(target, dtype=np.float64),
        np.asarray(batch, dtype=np.int64),
        np.asarray(count, dtype=np.int64),
    )
