"""Multi-turn sessions in the simulator: turn k+1 leaves think time after the simulated turn k
ends, and the prefix cache sees what the turns really share.

Why its own module: the plan fixes which turns a session has and their think times, but when
turn k ends is only known while the simulation runs (as in the driver, `driver/history.py`);
the cluster's loop asks here what a turn's end sets off. A turn that does not end `ok` ends
its session: every later turn is recorded `not_sent` with the reason, as the driver does.

What a turn finds cached (the prefix-cache chains of `prefix.py`):
- a length-forced run (the driver's default) keeps the dataset's replies in the history, so
  every turn's prompt of one conversation begins with its earlier turns' prompts, in whichever
  session: one chain per conversation, and a turn may reuse all of its own prompt that any
  earlier turn of that conversation cached (two sessions drawn from one row share it all);
  the reply the server generated is never reused;
- when the history carries the reply the server gave (the driver without the optional fields,
  `--no-optional-fields`), turn k+1 begins with turn k's prompt and reply: one chain per
  session, holding its replies too (an odd group).
Shared system prompts across conversations are not modelled (the simulator sees no text).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from phaselens.sim.loop import TURN
from phaselens.sim.native import init_args
from phaselens.sim.prefix import SESSION_GROUPS
from phaselens.sim.records import ST_OK, ST_REJECTED
from phaselens.types import Schedule
from phaselens.workload.views import next_turns

if TYPE_CHECKING:
    from phaselens.sim.cluster import Cluster


@dataclass(frozen=True, slots=True)
class Sessions:
    """A schedule's sessions, as the cluster's loop reads them (lists: indexed per event)."""

    next_row: list[int]  # the same session's next turn per row (-1: none)
    think_ns: list[int]  # think time before this row's turn (after the previous turn's end)
    held: npt.NDArray[np.bool_]  # rows sent by their previous turn's end, not at their instant
    turn: list[int]
    group: list[int]  # a session row's own prefix-cache chain (-1: not in a session)

    def __reduce__(self) -> tuple[type[Sessions], tuple[object, ...]]:
        return (Sessions, init_args(self))  # compiled, frozen: see native.init_args


def plan_sessions(schedule: Schedule, replies: frozenset[str] = frozenset()) -> Sessions | None:
    """None without sessions. `replies`: models whose later turns carry the reply the server
    gave (else the dataset's reply: a length-forced run)."""
    nxt = next_turns(schedule)
    p = schedule.prompts
    if nxt is None or p is None:
        return None
    in_session = p.session_id >= 0
    held = in_session & (p.turn > 0)
    carry = np.asarray([m in replies for m in schedule.models], np.bool_)[schedule.model_idx]
    # groups SESSION_GROUPS + 4x + kind: kind 0 a conversation's chain, 2 a session's (no
    # text to say which conversation), 1 a session's with its replies
    by_row = ~carry & (p.row >= 0)
    x = np.where(by_row, p.row, p.session_id).astype(np.int64)
    kind = np.where(carry, 1, np.where(by_row, 0, 2)).astype(np.int64)
    group = np.where(in_session, SESSION_GROUPS + 4 * x + kind, -1).astype(np.int64)
    return Sessions(
        nxt.tolist(),
        p.think_ns.tolist(),
        held,
        p.turn.tolist(),
        group.tolist(),
    )


def attach(cl: Cluster, s: Sessions) -> None:
    """A session row's prefix group is its chain; without the replies in the history its whole
    prompt may be cached already, with them what it shares is set when its previous turn ends
    (`turn_ended`). The engines note each request's hit tokens (`server_cached_tokens`)."""
    grp, pre, inp = cl.grp, cl.pre, cl.inp
    for row, g in enumerate(s.group):
        if g >= 0:
            grp[row] = g
            pre[row] = 0 if g & 1 else max(1, inp[row])
    for st in cl.engines:
        st.hits = cl.rec.hits


def turn_due(cl: Cluster, k: int) -> None:
    """TURN: turn k leaves the client now, think time after its previous turn ended (its
    scheduled instant, as the driver counts it)."""
    cl.rec.scheduled_ns[k] = cl.now
    cl.to_send.extend(cl.client.turns((k,)))
    cl._start_engines(cl._release_sends())


def turn_ended(cl: Cluster, rid: int) -> bool:
    """Turn `rid` ended now (finished or refused): its session's next turn leaves think time
    later (True), or the session is over (False; its later turns recorded as not sent when
    this one failed)."""
    s = cl.sessions
    assert s is not None
    j = s.next_row[rid]
    if j < 0:
        return False
    rec = cl.rec
    status = int(rec.status[rid])
    if status != ST_OK:
        why = "http_error" if status == ST_REJECTED else "not_sent"
        end_session(cl, j, f"session ended: turn {s.turn[rid]} ended {why}")
        return False
    if s.group[rid] & 1:  # the next prompt begins with this prompt and this reply
        cl.pre[j] = max(1, cl.inp[rid]) + int(rec.delivered[rid])
    cl.loop.push(cl.now + s.think_ns[j], TURN, j)
    return True


def end_session(cl: Cluster, row: int, why: str) -> None:
    """Record `row` and the session's later turns not sent, with the reason."""
    s = cl.sessions
    assert s is not None
    while row >= 0:
        cl.rec.not_sent(row, why)
        row = s.next_row[row]
