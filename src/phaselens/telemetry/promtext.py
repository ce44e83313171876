"""The Prometheus exposition text of one scrape, parsed into families: prometheus-client's
parser behind a line check (a bad line is skipped and counted, not the whole scrape lost) and an
optional per-source cache of each scrape's shape.

Why apart from `prometheus.py`: this is text -> families; `prometheus.py` is families ->
interval samples (counters, histograms, canonical names). The shape cache is owned by the caller
(one per scrape source, `ShapeCache`): no process-wide state, and two sources never share one.

The `_total` gotcha: prometheus-client strips `_total` from counter family names and appends
`_total` to counter samples that lack it (llama.cpp's `llamacpp:n_tokens_max`). We restore the
name the server actually printed, so raw names always match the text on the wire.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

COUNTERISH = frozenset({"counter"})


@dataclass(frozen=True, slots=True)
class PromSample:
    """One line of the exposition: its printed name, labels and value."""

    name: str
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class Family:
    """A metric family: `type` is counter, gauge, histogram, summary, untyped, info, ..."""

    name: str
    type: str
    samples: tuple[PromSample, ...]


# A sample line: name, optional {labels} (quoted values may hold anything escaped), value,
# optional timestamp. Linear-time: each alternative starts with a different character.
_SAMPLE_LINE = re.compile(
    r'[ \t]*([a-zA-Z_:][a-zA-Z0-9_:]*)[ \t]*(\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?'
    r"[ \t]*([^ \t]+)(?:[ \t]+-?[0-9]+)?[ \t]*"
)
_TYPES = frozenset(
    (
        "counter",
        "gauge",
        "histogram",
        "summary",
        "untyped",
        "unknown",
        "info",
        "stateset",
        "gaugehistogram",
    )
)
_NAME_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_:")
MAX_ABS_VALUE = 1e18  # a reading beyond this is not a measurement: the line is skipped
MAX_LINE_CHARS = 16384  # a longer line (vLLM's longest: ~300) is skipped and counted
MAX_SAMPLES = 50_000  # sample lines kept per scrape (vLLM: ~650); the rest skipped, counted


@dataclass(frozen=True, slots=True)
class Parsed:
    """One scrape's families, and the lines that could not be used (skipped, counted)."""

    families: dict[str, Family]
    skipped: int = 0
    first_skipped: str = ""  # `line N: <text>` of the first one, for the manifest
    buckets: Sequence[str] = ()  # with buckets=False: the kept families' bucket lines, unread


class _Lines:
    """The lines kept for the parser, and the ones skipped (with the first for the message)."""

    def __init__(self) -> None:
        self.kept: list[str] = []
        self.buckets: list[str] = []  # bucket lines of kept families, when not parsed
        self.names: set[str] = set()
        self.samples = 0
        self.skipped = 0
        self.first = ""

    def skip(self, n: int, line: str) -> None:
        self.skipped += 1
        if not self.first:
            self.first = f"line {n}: {line[:80]!r}"


def _value_check(text: str) -> int:
    """1: a usable value; 0: NaN or ±Inf (valid exposition, no reading: dropped quietly);
    -1: not a number, or beyond MAX_ABS_VALUE (the line is skipped and counted)."""
    try:
        v = float(text)
    except ValueError:
        return -1
    if not math.isfinite(v):
        return 0
    return 1 if abs(v) <= MAX_ABS_VALUE else -1


@functools.lru_cache(maxsize=32)
def _heads(keep: tuple[str, ...]) -> tuple[int, frozenset[str]]:
    """(k, the first k characters of every kept prefix): a line whose first k characters are
    not among them cannot start with any of them (one set lookup instead of a startswith each)."""
    k = min((len(p) for p in keep), default=0)
    return k, frozenset(p[:k] for p in keep)


def _prefilter(text: str, keep: tuple[str, ...], buckets: bool, every_line: bool = False) -> _Lines:
    """Keep only the families we want before the (slow) parser sees them; collect printed
    names; skip (and count) lines of ours that are not the exposition format.

    Why: prometheus-client takes ~60 µs a line, and vLLM prints ~650 lines, mostly buckets;
    and one bad line makes it reject the whole scrape. With `keep`, the lines that can be ours
    are found by one compiled regex in C (`_candidates`), and only those are checked here:
    the same lines, in the same order, as the pass over every line finds (`every_line`: that
    pass alone; a test compares the two).
    """
    out = _Lines()
    found = None if every_line else _candidates(text, keep)
    if found is not None:
        for line in found:
            _line(out, 0, line, keep, buckets)
        if not out.skipped:
            return out
        return _prefilter(text, keep, buckets, True)  # a bad line: the full pass numbers it
    k, heads = _heads(keep)
    for n, line in enumerate(text.splitlines(), 1):
        if keep and (
            (line[:1] in _NAME_START and (line[:k] not in heads or not line.startswith(keep)))
            or line.startswith("# HELP ")
            or (line.startswith("# TYPE ") and line[7 : 7 + k] not in heads)
        ):
            continue  # another family's sample or TYPE (its name cannot start with ours), HELP
        _line(out, n, line, keep, buckets)
    return out


def _line(out: _Lines, n: int, line: str, keep: tuple[str, ...], buckets: bool) -> None:
    """Line `n` of the scrape (one that may be ours): kept, dropped, or skipped and counted."""
    if not line.strip():
        return
    if len(line) > MAX_LINE_CHARS:
        out.skip(n, line)
        return
    if line.lstrip().startswith("#"):
        parts = line.split(None, 3)
        if len(parts) >= 3 and parts[1] == "TYPE" and (not keep or parts[2].startswith(keep)):
            if len(parts) == 4 and parts[3].strip() in _TYPES:
                out.kept.append(line)
            else:
                out.skip(n, line)
        return
    if not buckets and "_bucket" in line:
        cut = min((i for i in (line.find("{"), line.find(" ")) if i > 0), default=-1)
        if cut > 0 and line[:cut].endswith("_bucket"):
            out.buckets.append(line)
            return  # a bucket line, not parsed: dropped before the (costly) line check
    m = _SAMPLE_LINE.fullmatch(line)
    name = m[1] if m else ""
    if not name:
        named = re.match(r"[ \t]*([a-zA-Z_:][a-zA-Z0-9_:]*)", line)
        if named is None or not keep or named[1].startswith(keep):
            out.skip(n, line)  # no metric name at all, or one of ours that is malformed
        return
    if (keep and not name.startswith(keep)) or name.endswith("_created"):
        return
    if not buckets and name.endswith("_bucket"):
        out.buckets.append(line)
        return
    check = _value_check(m[3] if m else "")
    if check <= 0 or out.samples >= MAX_SAMPLES:
        if check != 0:  # a bad value, or one sample too many (NaN is dropped quietly)
            out.skip(n, line)
        return
    out.samples += 1
    out.names.add(name)
    out.kept.append(line)


def _trie(words: list[str]) -> str:
    """A regex matching what starts with one of `words`, as a trie (one branch per first
    character): sre tries an alternation branch by branch, the trie one character at a time."""
    if "" in words:
        return ""  # a shorter word already matched: whatever follows is a prefix match too
    first: dict[str, list[str]] = {}
    for w in sorted(set(words)):
        first.setdefault(w[0], []).append(w[1:])
    alts = [re.escape(c) + _trie(rest) for c, rest in first.items()]
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


# A line the pass over every line would look at though it names none of ours (not a name,
# HELP or TYPE line: indented, a stray comment, garbage).
_ODD_LINE = r"[^a-zA-Z_:#\n]|#(?! HELP | TYPE )"
# Line ends splitlines() also splits at: where one occurs, or an odd line, `_candidates` leaves
# the text to the pass over every line.
_OTHER_LINE_ENDS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


@functools.lru_cache(maxsize=32)
def _keep_regex(keep: tuple[str, ...]) -> re.Pattern[str]:
    """After a newline: a sample or TYPE line whose name starts with one of `keep` (group 1),
    or the start of an odd line (group 2)."""
    return re.compile(rf"\n(?:((?:# TYPE )?{_trie(list(keep))}[^\n]*)|({_ODD_LINE}))")


def _candidates(text: str, keep: tuple[str, ...]) -> list[str] | None:
    """Every line that may be ours, in order; None where the pass over every line must decide
    (no `keep`, an odd line, another line end)."""
    if not keep or any(c in text for c in _OTHER_LINE_ENDS):
        return None
    found = _keep_regex(keep).findall("\n" + text)
    if any(odd for _, odd in found):
        return None
    return [line for line, _ in found]


def _families(text: str, printed: set[str]) -> dict[str, Family]:
    """prometheus-client's parse of already filtered text (raises on what it rejects)."""
    found: dict[str, tuple[str, list[PromSample]]] = {}
    for fam in text_string_to_metric_families(text):
        samples = []
        for s in fam.samples:
            name = s.name
            if name not in printed and name.endswith("_total") and name[:-6] in printed:
                name = name[:-6]  # the parser appended `_total`; keep what was on the wire
            if name.endswith("_created"):
                continue
            samples.append(PromSample(name, dict(s.labels), float(s.value)))
        if not samples:
            continue
        key = samples[0].name if fam.type in COUNTERISH else fam.name
        old = found.get(key)  # untyped lines of one name come as a family each: merged
        if old is not None and old[0] == fam.type:
            old[1].extend(samples)
        else:
            found[key] = (fam.type, samples)
    return {k: Family(k, t, tuple(ss)) for k, (t, ss) in found.items()}


def _blocks(lines: list[str]) -> list[list[str]]:
    """Lines grouped by family: each `# TYPE` line starts a block."""
    blocks: list[list[str]] = [[]]
    for line in lines:
        if line.lstrip().startswith("#"):
            blocks.append([])
        blocks[-1].append(line)
    return [b for b in blocks if b]


class ShapeCache:
    """Shape of a scrape (its kept lines with the values cut out, and the printed names) -> the
    parser's families with each sample's value replaced by the index of the line it came from.
    One per scrape source; bounded (cleared when full: an engine's shapes are few)."""

    MAX = 256

    def __init__(self) -> None:
        self.shapes: dict[tuple[tuple[str, ...], frozenset[str]], dict[str, Family]] = {}

    def __len__(self) -> int:
        return len(self.shapes)


def _shape(lines: _Lines, cache: ShapeCache) -> tuple[dict[str, Family], list[str]] | None:
    """(the kept lines' shape: families whose sample values are kept-line indices, each kept
    line's value text), parsed once per shape; None where the shape parse failed.

    Why: an engine prints the same names, labels and TYPE lines scrape after scrape; only the
    values move. prometheus-client (~100 µs a line) parses each shape once, with line numbers in
    place of the values; every later scrape of that shape only converts its values (`float`,
    as the parser does: prefilter already refused what float() or the parser would not read)."""
    heads: list[str] = []
    values: list[str] = []
    for line in lines.kept:
        m = None if line.lstrip().startswith("#") else _SAMPLE_LINE.fullmatch(line)
        if m is None:
            heads.append(line)
            values.append("")
            continue
        if "_" in m[3] or m[3] != m[3].strip():
            return None  # the parser refuses `1_000`; let it say so
        heads.append(line[: m.start(3)] + "\0" + line[m.end(3) :])
        if "\0" in line:
            return None  # the marker must be ours alone
        values.append(m[3])
    key = (tuple(heads), frozenset(lines.names))
    shape = cache.shapes.get(key)
    if shape is None:
        text = "".join(
            (h.replace("\0", str(i)) if v else h) + "\n"
            for i, (h, v) in enumerate(zip(heads, values, strict=True))
        )
        try:
            shape = _families(text, lines.names)
        except Exception:
            return None
        if len(cache.shapes) >= cache.MAX:
            cache.shapes.clear()
        cache.shapes[key] = shape
    return shape, values


def _by_shape(lines: _Lines, cache: ShapeCache) -> dict[str, Family] | None:
    """The families of the kept lines from a cached parse of their shape (`_shape`), or None
    (the caller parses the text itself)."""
    got = _shape(lines, cache)
    if got is None:
        return None
    shape, values = got
    return {
        k: Family(
            f.name,
            f.type,
            tuple(
                PromSample(s.name, dict(s.labels), float(values[int(s.value)])) for s in f.samples
            ),
        )
        for k, f in shape.items()
    }


def _parse_lenient(lines: _Lines, cache: ShapeCache | None) -> dict[str, Family]:
    """Families of the kept lines; what the parser still rejects is skipped by family, then by
    line (rare: only a scrape the line check let through pays for this)."""
    fast = _by_shape(lines, cache) if cache is not None else None
    if fast is not None:
        return fast
    try:
        return _families("\n".join(lines.kept) + "\n", lines.names)
    except Exception:  # the parser's own complaint; found below, line by line
        pass
    families: dict[str, Family] = {}
    for block in _blocks(lines.kept):
        try:
            families.update(_families("\n".join(block) + "\n", lines.names))
            continue
        except Exception:
            pass
        head = block[:1] if block[0].lstrip().startswith("#") else []
        good: list[str] = []
        for line in block[len(head) :]:
            try:
                _families("\n".join([*head, *good, line]) + "\n", lines.names)
                good.append(line)
            except Exception:
                lines.skip(0, line)
        with contextlib.suppress(Exception):
            families.update(_families("\n".join([*head, *good]) + "\n", lines.names))
    return families


def parse_prometheus_counted(
    text: str,
    keep: tuple[str, ...] = (),
    buckets: bool = True,
    shapes: ShapeCache | None = None,
) -> Parsed:
    """Like `parse_prometheus`, but never raises: unusable lines are skipped and counted.
    `shapes`: the caller's cache of scrape shapes (a source scraped again and again)."""
    lines = _prefilter(text, keep, buckets)
    families = _parse_lenient(lines, shapes)
    return Parsed(families, lines.skipped, lines.first, lines.buckets)


def parse_prometheus(
    text: str, keep: tuple[str, ...] = (), buckets: bool = True
) -> dict[str, Family]:
    """Parse Prometheus text into families keyed by the name the server printed.

    `keep`: only families whose names start with one of these prefixes (all when empty).
    `buckets=False` drops histogram buckets. `_created` timestamps are always dropped.
    Counter families are keyed by their printed sample name (`vllm:prompt_tokens_total`), others
    by their family name. Lines that are not the exposition format (a JSON line, a bad value,
    a value beyond 1e18) are skipped and counted, NaN/±Inf readings dropped; raises ValueError
    when nothing usable is left of a text that had such lines (not the exposition format).
    """
    p = parse_prometheus_counted(text, keep, buckets)
    if not p.families and p.skipped:
        raise ValueError(f"not Prometheus text: {p.skipped} unusable lines ({p.first_skipped})")
    return p.families
