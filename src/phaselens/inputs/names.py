"""Names that become path components (run directories) made safe.

Why: a spec's `name` is user text and ends up in `RUNS/<name>-<stamp>`; `../../x`, an absolute
path, a NUL byte or 300 characters must neither escape `--out` nor fail in `mkdir`. The slug
keeps `[A-Za-z0-9._-]`, turns every other run of characters into one `-`, drops leading dots
and dashes (no hidden or `..` components), and keeps at most `MAX_SLUG` characters.
"""

from __future__ import annotations

import re

MAX_SLUG = 64
_OTHER = re.compile(r"[^A-Za-z0-9._-]+")


def slugify(name: str, fallback: str = "run") -> str:
    """A safe single path component for `name` (`fallback` when nothing usable is left)."""
    slug = _OTHER.sub("-", name).lstrip(".-")[:MAX_SLUG].rstrip("-")
    return slug or fallback
