"""A Prometheus `/metrics` target (an engine or dcgm-exporter) scraped once per tick.

Why its own module: scraping is where the network can be slow, fail or disappear mid-run. Every
tick slot yields exactly one `scrape.ok` sample (1 scraped, 0 missing), so a gap is visible and
countable, and the next good scrape's counter increases cover the gap: nothing else is lost.
Samples are stamped at the midpoint of request and response; `scrape.latency_ms` says how
uncertain that stamp is (± half of it).
"""

from __future__ import annotations

import http.client
import urllib.parse
from collections.abc import Sequence

from phaselens.inputs.redact import basic_auth, redact_url, redact_urls_in
from phaselens.inputs.urls import check_url
from phaselens.telemetry.clock import RunClock
from phaselens.telemetry.httpget import KeepAliveGet
from phaselens.telemetry.prometheus import (
    DCGM_KEEP,
    ENGINE_KEEP,
    Scrape,
    detect_source,
    interval_samples,
)
from phaselens.telemetry.promplan import PlanCache, parse_planned
from phaselens.telemetry.promtext import Parsed
from phaselens.types import TelemetrySample

SCRAPE_TIMEOUT_S = 2.0
MAX_BODY_BYTES = 32 << 20  # a /metrics body larger than this is refused (vLLM's: ~100 kB)
# A source is "degraded" (not "ok") in the manifest from this many failed ticks on, when they
# are also at least this share of its ticks; the first readable reason is given.
DEGRADED_MIN = 3
DEGRADED_SHARE = 0.1
# Narrowed scrapes (`narrow=True`): the server is asked for the kept samples only, by
# prometheus-client's `name[]` filter (vLLM and SGLang serve /metrics with it). A full scrape
# this often learns families that appeared since; a narrowed answer at least this share of the
# full one's size means the server ignored the filter (llama.cpp, TGI).
NARROW_REFRESH_S = 30.0
NARROW_IGNORED_SHARE = 0.9


class StatusError(OSError):
    """The server answered with a status other than 200 (the message: `HTTP <status>`)."""


def health(name: str, ok: int, failed: int, why: str, skipped: int = 0, skip_why: str = "") -> str:
    """The manifest status of a source: ok, degraded: <what failed>, or unavailable: <why>."""
    if failed and not ok:
        return f"unavailable: no successful {name} ({why})"
    parts = []
    if failed >= DEGRADED_MIN and failed >= DEGRADED_SHARE * (ok + failed):
        parts.append(f"{failed} of {ok + failed} {name}s failed (last: {why})")
    if skipped:
        parts.append(f"{skipped} unparseable lines skipped (first: {skip_why})")
    return "degraded: " + "; ".join(parts) if parts else "ok"


SCRAPE_SOURCE = "scrape"  # the `source` of scrape.ok / scrape.latency_ms / scrape.interval_ms


def metrics_url(target: str) -> str:
    """`http://host:port/v1` (an OpenAI base URL) -> `http://host:port/metrics`."""
    u = urllib.parse.urlsplit(check_url(target, "--telemetry"))
    return f"{u.scheme}://{u.netloc}/metrics"


class ScrapeSource:
    """Scrapes one URL; `kind` is "engine" (vllm:/sglang:/tgi_/llamacpp: kept) or "dcgm"."""

    def __init__(
        self,
        url: str,
        kind: str,
        clock: RunClock,
        timeout_s: float = SCRAPE_TIMEOUT_S,
        keep: tuple[str, ...] | None = None,
        narrow: bool = False,
    ) -> None:
        u = urllib.parse.urlsplit(check_url(url, "--telemetry"))
        self.url = url  # sent as is (user:password as Basic auth); stored only redacted
        self.name = f"{kind}@{redact_url(url)}"
        self.kind = kind
        self._keep = keep or (DCGM_KEEP if kind == "dcgm" else ENGINE_KEEP)  # families parsed
        self._clock = clock
        self._timeout = timeout_s
        self._https = u.scheme == "https"
        self._host = u.hostname or ""  # check_url: there is one
        self._port = u.port
        self._path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        self._conn: http.client.HTTPConnection | None = None  # https only
        self._headers = {"Accept": "text/plain"}
        auth = basic_auth(url)
        if auth is not None:
            self._headers["Authorization"] = auth
        hostport = u.netloc.rpartition("@")[2]
        self._get = KeepAliveGet(
            self._host, self._port or 80, hostport, self._path, self._headers, timeout_s
        )
        self._labels = {"target": redact_url(url)}
        self._prev: Scrape | None = None
        self._shapes = PlanCache()  # this endpoint's scrape shapes and plans, learnt once
        self.last_buckets: Sequence[str] = ()  # the last good scrape's bucket lines (kept
        # families'; the watch reads its latency histograms from them)
        self._baseline: Scrape | None = None
        # narrow: off (not asked), learning (a full scrape comes first), on (narrowed scrapes),
        # unsupported (no form of the path filtered: `narrow_why` says what came back)
        self.narrow_state = "learning" if narrow else "off"
        self.narrow_why = ""
        # The forms of the path a narrowed scrape tries, in turn: as given, and for a path
        # without a query also with a trailing slash (vLLM: `/metrics` is an unfiltered route
        # in front of the prometheus-client app mounted at `/metrics/`)
        self._narrow_forms = [self._path]
        if "?" not in self._path and not self._path.endswith("/"):
            self._narrow_forms.append(self._path + "/")
        self._narrow_form = 0
        self._narrow_query = ""
        self._narrow_ref: frozenset[str] = frozenset()  # the last full scrape's kept families
        self._full_chars = 0
        self._next_full_ns = 0
        self.ok_count = 0
        self.missing_count = 0  # ticks without a sample: failed, or skipped by an overrun
        self.failed_count = 0  # scrapes that failed (an error, a bad body)
        self.skipped_lines = 0  # lines of otherwise good scrapes that could not be parsed
        self.first_skipped = ""
        self.last_error = ""

    def _fetch(self, path: str) -> str:
        if self._https:  # http.client for TLS; plain http (every engine here) the lean client
            if self._conn is None:
                self._conn = http.client.HTTPSConnection(
                    self._host, self._port, timeout=self._timeout
                )
            self._conn.request("GET", path, headers=self._headers)
            resp = self._conn.getresponse()
            status, body = resp.status, resp.read(MAX_BODY_BYTES + 1)
        else:
            status, body = self._get.get(MAX_BODY_BYTES + 1, path)
        if len(body) > MAX_BODY_BYTES:
            raise ValueError(f"/metrics body over {MAX_BODY_BYTES >> 20} MiB")
        if status != 200:
            raise StatusError(f"HTTP {status}")
        return body.decode("utf-8", errors="replace")

    def _read(self, t0: int) -> Parsed:
        """One scrape, parsed: narrowed where the server honours it (see NARROW_*), else the
        whole page. A narrowed answer that is the whole page (the filter ignored: still used),
        an error status or one without a family of the last full scrape (replaced by a full
        scrape now) moves on to the next form of the path, and after the last one to none."""
        if self.narrow_state == "on" and t0 < self._next_full_ns:
            try:
                text = self._fetch(self._narrow_forms[self._narrow_form] + self._narrow_query)
                parsed = parse_planned(text, self._keep, False, self._shapes)
                if self._narrow_ref <= parsed.families.keys():
                    if len(text) >= NARROW_IGNORED_SHARE * self._full_chars:
                        self._narrow_next("the filter was ignored")
                    return parsed
                self._narrow_next("a family was missing from the narrowed answer")
            except StatusError as e:  # the filter refused (a dead server fails as any scrape)
                self._narrow_next(f"{e} to the narrowed query")
        text = self._fetch(self._path)
        parsed = parse_planned(text, self._keep, False, self._shapes)
        if self.narrow_state in ("learning", "on") and parsed.families:
            self._learn_narrow(parsed, len(text), t0)
        return parsed

    def _narrow_next(self, why: str) -> None:
        self._narrow_form += 1
        if self._narrow_form >= len(self._narrow_forms):
            self.narrow_state, self.narrow_why = "unsupported", why

    def _learn_narrow(self, parsed: Parsed, chars: int, t0: int) -> None:
        """The filter asking for every sample name of the kept families a full scrape printed."""
        names = {s.name for f in parsed.families.values() for s in f.samples}
        names.update(line.split("{", 1)[0].split(" ", 1)[0] for line in parsed.buckets)
        query = urllib.parse.urlencode([("name[]", n) for n in sorted(names)])
        self._narrow_query = ("&" if "?" in self._path else "?") + query
        self._narrow_ref = frozenset(parsed.families)
        self._full_chars = chars
        self._next_full_ns = t0 + int(NARROW_REFRESH_S * 1e9)
        self.narrow_state = "on"

    def tick(self) -> list[TelemetrySample]:
        t0 = self._clock.now_ns()
        try:
            parsed = self._read(t0)
            t1 = self._clock.now_ns()
            families = parsed.families
            if not families:
                why = f" ({parsed.first_skipped})" if parsed.skipped else ""
                raise ValueError(f"no {'/'.join(self._keep)} metrics in the response{why}")
            if parsed.skipped:  # a good scrape with some bad lines: counted, status says so
                self.skipped_lines += parsed.skipped
                self.first_skipped = self.first_skipped or parsed.first_skipped
        except Exception as e:  # any failure of one scrape is a missing sample, never a crash
            t1 = self._clock.now_ns()
            self._drop_connection()
            self.missing_count += 1
            self.failed_count += 1
            self.last_error = redact_urls_in(f"{type(e).__name__}: {e}")[:200]
            return self._meta((t0 + t1) // 2, ok=False, latency_ns=t1 - t0)
        mid = (t0 + t1) // 2
        self.last_buckets = parsed.buckets
        cur = Scrape(mid, families)
        source = "dcgm" if self.kind == "dcgm" else (detect_source(families) or "engine")
        out = self._meta(mid, ok=True, latency_ns=t1 - t0)
        if self._prev is not None:
            out.append(
                TelemetrySample(
                    mid,
                    SCRAPE_SOURCE,
                    "scrape.interval_ms",
                    (mid - self._prev.t_ns) / 1e6,
                    self._labels,
                )
            )
        if self._baseline is None:
            self._baseline = cur
        out.extend(interval_samples(self._prev, cur, source, self._labels, self._baseline))
        self._prev = cur
        self.ok_count += 1
        return out

    @property
    def last(self) -> Scrape | None:
        """The last successful scrape (its families)."""
        return self._prev

    def missed(self, t_ns: int) -> list[TelemetrySample]:
        """A tick slot skipped because the previous scrape overran: marked missing."""
        self.missing_count += 1
        return [TelemetrySample(t_ns, SCRAPE_SOURCE, "scrape.ok", 0.0, self._labels)]

    def _meta(self, t_ns: int, ok: bool, latency_ns: int) -> list[TelemetrySample]:
        return [
            TelemetrySample(t_ns, SCRAPE_SOURCE, "scrape.ok", 1.0 if ok else 0.0, self._labels),
            TelemetrySample(
                t_ns, SCRAPE_SOURCE, "scrape.latency_ms", latency_ns / 1e6, self._labels
            ),
        ]

    def _drop_connection(self) -> None:
        self._get.close()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def statuses(self) -> dict[str, str]:
        """ok; degraded when scrapes failed repeatedly or lines were skipped (see `health`);
        unavailable when no scrape succeeded. Not tried yet counts as opened fine."""
        if not self.ok_count and self.missing_count and not self.failed_count:
            self.last_error = "every tick slot skipped: the previous scrape overran"
        failed = self.failed_count or (0 if self.ok_count else self.missing_count)
        return {
            self.name: health(
                "scrape",
                self.ok_count,
                failed,
                self.last_error,
                self.skipped_lines,
                self.first_skipped,
            )
        }

    def close(self) -> None:
        self._drop_connection()
