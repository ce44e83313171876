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

from phaselens.errors import InputError
from phaselens.telemetry.clock import RunClock
from phaselens.telemetry.prometheus import (
    DCGM_KEEP,
    ENGINE_KEEP,
    Scrape,
    detect_source,
    interval_samples,
    parse_prometheus,
)
from phaselens.types import TelemetrySample

SCRAPE_TIMEOUT_S = 2.0
SCRAPE_SOURCE = "scrape"  # the `source` of scrape.ok / scrape.latency_ms / scrape.interval_ms


def metrics_url(target: str) -> str:
    """`http://host:port/v1` (an OpenAI base URL) -> `http://host:port/metrics`."""
    u = urllib.parse.urlsplit(target)
    if u.scheme not in ("http", "https") or not u.netloc:
        raise InputError(f"--telemetry: not an http(s) URL: {target!r}")
    return f"{u.scheme}://{u.netloc}/metrics"


class ScrapeSource:
    """Scrapes one URL; `kind` is "engine" (vllm:/sglang:/tgi_/llamacpp: kept) or "dcgm"."""

    def __init__(
        self, url: str, kind: str, clock: RunClock, timeout_s: float = SCRAPE_TIMEOUT_S
    ) -> None:
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise InputError(f"--telemetry: not an http(s) URL: {url!r}")
        self.url = url
        self.name = f"{kind}@{url}"
        self.kind = kind
        self._keep = DCGM_KEEP if kind == "dcgm" else ENGINE_KEEP
        self._clock = clock
        self._timeout = timeout_s
        self._https = u.scheme == "https"
        self._host = u.hostname
        self._port = u.port
        self._path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        self._conn: http.client.HTTPConnection | None = None
        self._labels = {"target": url}
        self._prev: Scrape | None = None
        self._baseline: Scrape | None = None
        self.ok_count = 0
        self.missing_count = 0
        self.last_error = ""

    def _fetch(self) -> str:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = cls(self._host, self._port, timeout=self._timeout)
        self._conn.request("GET", self._path, headers={"Accept": "text/plain"})
        resp = self._conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise OSError(f"HTTP {resp.status}")
        return body.decode("utf-8", errors="replace")

    def tick(self) -> list[TelemetrySample]:
        t0 = self._clock.now_ns()
        try:
            text = self._fetch()
            t1 = self._clock.now_ns()
            families = parse_prometheus(text, self._keep, buckets=False)
            if not families:
                raise ValueError(f"no {'/'.join(self._keep)} metrics in the response")
        except (OSError, http.client.HTTPException, ValueError, UnicodeError) as e:
            t1 = self._clock.now_ns()
            self._drop_connection()
            self.missing_count += 1
            self.last_error = f"{type(e).__name__}: {e}"[:200]
            return self._meta((t0 + t1) // 2, ok=False, latency_ns=t1 - t0)
        mid = (t0 + t1) // 2
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
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def statuses(self) -> dict[str, str]:
        if self.ok_count or not self.missing_count:  # not tried yet counts as opened fine
            return {self.name: "ok"}
        return {self.name: f"unavailable: no successful scrape ({self.last_error})"}

    def close(self) -> None:
        self._drop_connection()
