"""The driver's run writer thread: records and telemetry samples reach the RunWriter through one
queue, so fsync never blocks the event loop and the sampler's thread and the loop share one
writer safely. Never loses a planned request's record (see `WriterThread`)."""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any

from phaselens.driver.packed import Packed, stand_in, unpack
from phaselens.driver.selfcheck import LatencyScale
from phaselens.rundir.write import RunWriter
from phaselens.types import RequestRecord, TelemetrySample


class WriterThread:
    """Owns the RunWriter: records and telemetry samples arrive through one queue.

    Never fails silently, and never stops taking items: what it cannot write is counted, the
    first such failure kept in `failure` (the run then fails with it, see `drive`), and it goes
    on with the rest. A record whose values do not fit the run's columns is replaced by a
    stand-in (same id, status client_error, the reason as its error): still exactly one record
    per planned request. Why: this thread dying on one bad record used to lose the whole run
    under a manifest that said `complete`.
    """

    def __init__(self, writer: RunWriter) -> None:
        self.writer = writer
        self.q: queue.SimpleQueue[tuple[str, Any] | None] = queue.SimpleQueue()
        self.ids: set[int] = set()
        self.scale = LatencyScale()  # TTFT/ITL medians the self-check judges client lag against
        self.failure = ""  # the first write that failed, and why
        self.failures = 0
        self._t = threading.Thread(target=self._run, name="phaselens-writer", daemon=True)
        self._t.start()

    @property
    def error(self) -> str:
        """One line for the run's error ("" when every write succeeded)."""
        if not self.failures:
            return ""
        more = f" (and {self.failures - 1} more)" if self.failures > 1 else ""
        return f"run writer: {self.failure}{more}; the run is marked partial"

    def _fail(self, e: BaseException, what: str = "") -> None:
        self.failures += 1
        if not self.failure:
            self.failure = f"{what}{type(e).__name__}: {e}"

    def _guard(self, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as e:  # counted and said; the thread goes on
            self._fail(e)

    def _store(self, r: RequestRecord) -> None:
        if r.id in self.ids:  # exactly one record per planned request
            return
        self.ids.add(r.id)
        self.scale.add(r)
        try:
            self.writer.add_record(r)
        except ValueError as e:  # a value that does not fit its column: nothing was kept
            self._fail(e, "record not stored: ")
            self._guard(self.writer.add_record, stand_in(r, e))
        except Exception as e:  # e.g. a failed flush: the record is kept
            self._fail(e)

    def _store_packed(self, p: Packed) -> None:
        """A batch packed by its worker (`driver.packed`): in bulk, or, when one of its ids is
        already recorded, record by record (what it counted and what failed still count)."""
        for text in p.failures:
            self.failures += 1
            self.failure = self.failure or text
        if not self.ids.isdisjoint(p.ids):  # (a stand-in's original then counts no latency)
            for r in unpack(p):
                self._store(r)
            return
        self.scale.merge(p.scale)
        self.ids.update(p.ids)
        self._guard(self.writer.add_encoded, p.lines, p.cols)

    def record(self, r: RequestRecord) -> None:
        self.q.put(("r", r))

    def records(self, rs: list[RequestRecord] | Packed) -> None:
        if isinstance(rs, Packed):
            self.q.put(("p", rs))
            return
        for r in rs:
            self.q.put(("r", r))

    def samples(self, ss: list[TelemetrySample]) -> None:
        self.q.put(("t", list(ss)))

    def _run(self) -> None:
        w = self.writer
        while True:
            try:
                item = self.q.get(timeout=0.5)
            except queue.Empty:
                self._guard(w.flush)
                continue
            if item is None:
                self._guard(w.flush)
                return
            kind, obj = item
            if kind == "sync":
                obj.set()
            elif kind == "r":
                self._store(obj)
            elif kind == "p":
                self._store_packed(obj)
            else:
                self._guard(w.add_samples, obj)

    def join(self) -> None:
        self.q.put(None)
        self._t.join()


def close_run(writer: RunWriter, wt: WriterThread, status: str, **fields: Any) -> Path:
    """Close the run; a close that fails is the run's failure, and the directory keeps its
    event log (every record written so far; `load_run` rebuilds the run from it)."""
    try:
        return writer.close(status, **fields)
    except Exception as e:  # said as the run's error (cli: exit 1)
        wt._fail(e, "could not close the run: ")
        return writer.path


def seen_ids(wt: WriterThread) -> set[int]:
    """Ids recorded so far (waits until the writer thread has taken everything queued)."""
    done = threading.Event()
    wt.q.put(("sync", done))
    while not done.wait(timeout=0.5) and wt._t.is_alive():
        pass
    return set(wt.ids)
