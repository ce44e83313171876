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

from phaselens.sim.config import Deployment
from phaselens.sim.cost import prefill_attn_units
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
    v = _client_view(requests, sched)
    ids, sent, end, first, toks, cnts, ok, prompt = (
        v.ids,
        v.sent,
        v.end,
        v.first,
        v.toks,
        v.cnts,
        v.ok,
        v.prompt,
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
    return _observations(feats, group, weight, target, batch, count)


# A decoding request's token read this close to another request's first token came out of the
# same step (the client reads both streams within ~0.4 ms here: docs/validation.md, closed loop),
# and its neighbouring tokens at least twice as far away, so the step is not confused with one
# of the decode steps around it.
SAME_STEP_S = 0.5e-3


def prefill_gaps(requests: pl.DataFrame, sched: Schedule, deploy: Deployment) -> DecodeGaps | None:
    """Steps in which one request's whole prefill ran beside decoding ones, from client times.

    Why: requests served alone cannot tell the engine's fixed time per admitted request (c_req,
    which delays every sequence decoding in that step) from the time outside the engine (r,
    which delays only that request's TTFT): they are twins in every TTFT. The step that admits
    request B while A decodes shows c_req alone: A's token gap across it is one step of A's
    decode plus B's whole prompt (one chunk), its new-request cost included, and r not at all.

    A gap (t[j-1], t[j]) of a decoding request A measures that step when B's first token is
    read within SAME_STEP_S of t[j] (both sampled at the step's end) and A's neighbouring tokens
    are further off; B's prompt fits the step's token budget beside the decoders; every other
    request decoding at any moment of the gap decodes throughout it; no other request gets its
    first token or waits in it (waiting is allowed only when the step fills every slot); and
    both of A's tokens were read alone. One observation per admitted request: the mean over the
    decoding requests whose gaps measure its step. None on engines the gaps cannot see
    (`gaps_usable`) or with a prefix cache (the prefilled length is then unknown).
    """
    if not gaps_usable(deploy) or sched.ids is None:
        return None
    e = deploy.engines[0]
    if e.policy.prefix_cache:
        return None
    hw = engine_hw(deploy, e)
    slots = e.policy.max_num_seqs
    budget = e.policy.max_num_batched_tokens if e.policy.chunked_prefill else NEVER
    v = _client_view(requests, sched)
    ids, sent, end, first, toks, cnts, prompt = (
        v.ids,
        v.sent,
        v.end,
        v.first,
        v.toks,
        v.cnts,
        v.prompt,
    )
    ok = v.ok & v.got_first
    tol = int(SAME_STEP_S * 1e9)
    feats: list[Steps] = []
    group: list[I64] = []
    weight: list[F64] = []
    target: list[float] = []
    batch: list[int] = []
    count: list[int] = []
    for bq in np.flatnonzero(ok & (prompt > 0)):
        fb = int(first[bq])
        obs_feats: list[Steps] = []
        obs_gaps: list[float] = []
        n_obs_seqs = 0
        others = np.ones(ids.shape[0], dtype=bool)
        others[bq] = False
        for aq in np.flatnonzero(ok & (first < fb - tol) & (end > fb + tol)):
            t, c = toks[aq], cnts[aq]
            j = int(np.argmin(np.abs(t - fb))) if t.shape[0] else 0
            if j < 1 or abs(int(t[j]) - fb) > tol or fb - int(t[j - 1]) <= 2 * tol:
                continue
            if j + 1 < t.shape[0] and int(t[j + 1]) - fb <= 2 * tol:
                continue
            if c.shape[0] == t.shape[0] and (c[j] != 1 or c[j - 1] != 1):
                continue
            a, b = int(t[j - 1]), int(t[j])
            dec_all = others & (first <= a) & (end >= b)
            dec_any = others & (first < b) & (end > a)
            wait_any = others & (sent < b) & (first > a)
            n_dec = int(dec_all.sum())  # A among them
            if (dec_all != dec_any).any() or not dec_all[aq]:
                continue
            if wait_any.any() and (n_dec + 1 < slots or (first[wait_any] <= b + tol).any()):
                continue
            if int(prompt[bq]) + n_dec > budget:
                continue
            sum_ctx = 0.0
            firsts = 0.0
            for q in np.flatnonzero(dec_all):
                got = int(np.searchsorted(toks[q], a, side="right"))
                sum_ctx += float(prompt[q] + got - 1)
                firsts += float(got == 1)
            p = int(prompt[bq])
            one = np.ones(1)
            obs_feats.append(
                step_features(
                    e,
                    hw,
                    one * (n_dec + p),
                    one * (n_dec + 1),
                    one * (sum_ctx + n_dec + prefill_attn_units(p, 0)),
                    one * sum_ctx,
                    one * (n_dec + 1),
                    deploy.cost.allreduce_latency_s,
                    new=one,
                    first=one * firsts,
                    waiting=one * float(wait_any.sum()),
                )
            )
            obs_gaps.append((b - a) / 1e9)
            n_obs_seqs = n_dec + 1
        if not obs_gaps:
            continue
        m = len(obs_gaps)
        obs = len(target)
        feats.extend(obs_feats)
        group.append(np.full(m, obs, dtype=np.int64))
        weight.append(np.full(m, 1.0 / m))
        target.append(float(np.mean(obs_gaps)))
        batch.append(n_obs_seqs)
        count.append(m)
    return _observations(feats, group, weight, target, batch, count)


def joined(a: DecodeGaps | None, b: DecodeGaps | None) -> DecodeGaps | None:
    """Both sets of gap observations as one (observation indices of `b` after `a`'s)."""
    if a is None or b is None:
        return a if b is None else b
    n_a = a.target.shape[0]
    basis = Isolated(
        steps=concat([a.basis.steps, b.basis.steps]),
        group=np.concatenate([a.basis.group, b.basis.group + n_a]),
        weight=np.concatenate([a.basis.weight, b.basis.weight]),
        is_ttft=np.concatenate([a.basis.is_ttft, b.basis.is_ttft]),
        fixed_obs=np.concatenate([a.basis.fixed_obs, b.basis.fixed_obs]),
    )
    return DecodeGaps(
        basis,
        np.concatenate([a.target, b.target]),
        np.concatenate([a.batch, b.batch]),
        np.concatenate([a.gaps, b.gaps]),
    )


@dataclass(frozen=True, slots=True)
class _View:
    """The client's times per sent request, in the order of `requests` (first token: its end
    when it never got one — waiting until it ended), and its prompt as the schedule has it."""

    ids: I64
    sent: I64
    end: I64
    first: I64
    toks: list[I64]
    cnts: list[I64]
    ok: np.ndarray
    got_first: np.ndarray
    prompt: I64


def _client_view(requests: pl.DataFrame, sched: Schedule) -> _View:
    assert sched.ids is not None
    f = requests.filter(pl.col("sent_ns").is_not_null())
    ids = f["id"].to_numpy().astype(np.int64)
    end = f["end_ns"].fill_null(NEVER).to_numpy().astype(np.int64)
    first = f["first_token_ns"].fill_null(-1).to_numpy().astype(np.int64)
    row_of = {int(i): r for r, i in enumerate(sched.ids.tolist())}
    return _View(
        ids=ids,
        sent=f["sent_ns"].to_numpy().astype(np.int64),
        end=end,
        first=np.where(first < 0, end, first),
        toks=[np.asarray(t if t is not None else [], dtype=np.int64) for t in f["token_ns"]],
        cnts=[np.asarray(c if c is not None else [], dtype=np.int64) for c in f["token_counts"]],
        ok=(f["status"] == "ok").to_numpy(),
        got_first=first >= 0,
        prompt=np.asarray(
            [sched.input_tokens[row_of[int(i)]] if int(i) in row_of else 0 for i in ids],
            dtype=np.int64,
        ),
    )


def _observations(
    feats: list[Steps],
    group: list[I64],
    weight: list[F64],
    target: list[float],
    batch: list[int],
    count: list[int],
) -> DecodeGaps | None:
    """The observations gathered (each the mean of its steps) as one DecodeGaps; None if none."""
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
