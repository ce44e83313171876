"""What every telemetry source is: a plain class with tick/missed/statuses/close.

Why a Protocol and not a base class: sources share no code, only this shape; the sampler's
`SOURCES` dict maps a `--telemetry` kind to a function that opens one.
"""

from __future__ import annotations

from typing import Protocol

from phaselens.types import TelemetrySample


class Unavailable(Exception):
    """A source cannot start here (no GPU, no library, no process): one line for the manifest."""


class Source(Protocol):
    """`tick` samples now; `missed` marks a tick slot lost to an overrun; `statuses` gives
    the manifest entries ("ok" / "unavailable: why") this source owns."""

    name: str

    def tick(self) -> list[TelemetrySample]: ...

    def missed(self, t_ns: int) -> list[TelemetrySample]: ...

    def statuses(self) -> dict[str, str]: ...

    def close(self) -> None: ...
