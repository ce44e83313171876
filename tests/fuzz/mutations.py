"""Hypothesis strategies for bad inputs: mutated YAML trees, damaged bytes, hostile values.

A YAML mutation replaces one node of a real example (examples/*.yaml, examples/deploy/*.yaml, a
calibration file) with a hostile value, deletes it, or adds an unknown key next to it. Values
that YAML cannot carry through `safe_dump` (alias bombs, deep nesting, tags) are spliced in as
raw text. `HEAVY` values may take time or memory by design: their cases run in a subprocess.
"""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import strategies as st

RAW = "__FUZZRAW__"

# Hostile YAML scalars and small collections, as YAML text.
NUMBERS = [
    ".nan",
    ".inf",
    "-.inf",
    "1e308",
    "-1e308",
    "1e309",
    "1e-320",
    str(2**63),
    str(2**64),
    str(-(2**63) - 1),
    "0",
    "-1",
    "-0.0",
    "0.5",
    "1e9",
    "9" * 400,
    "9" * 5000,
    "0x7fffffffffffffff",
    "0o777",
    "1_000",
]
TYPES = [
    "null",
    "true",
    "''",
    "'abc'",
    "[]",
    "{}",
    "[1, 2]",
    "{a: 1}",
    "2001-12-14",
    "!!binary AAAA",
    "!!python/object/apply:os.system ['touch PWNED']",
    "!!set {a, b}",
    '"\\0"',
    '"\\x1b[31mred\\u202e"',
    "'" + "n" * 300 + "'",
    "[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]",
    "'../../escape'",
    "'/'",
    "'.'",
    "'a/b'",
]


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """`levels` anchors each listing the previous `width` times: width**levels leaves."""
    parts = ["&a0 [" + ", ".join(["x"] * width) + "]"]
    for i in range(1, levels):
        parts.append(f"&a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "[" + ", ".join(parts) + "]"


HEAVY = [
    alias_bomb(),
    "[" * 5000 + "]" * 5000,
    "{a: " * 3000 + "1" + "}" * 3000,
    "'" + "x" * 2_000_000 + "'",
    "9" * 100_000,
]

hostile_text = st.sampled_from(NUMBERS + TYPES)


def paths(tree: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every node's path (keys and indices) in a loaded YAML tree, the root excluded."""
    out: list[tuple[Any, ...]] = []
    items: list[tuple[Any, Any]] = []
    if isinstance(tree, dict):
        items = list(tree.items())
    elif isinstance(tree, list):
        items = list(enumerate(tree))
    for k, v in items:
        out.append((*prefix, k))
        out.extend(paths(v, (*prefix, k)))
    return out


def _set(tree: Any, path: tuple[Any, ...], value: Any, op: str) -> Any:
    """A copy of `tree` with the node at `path` replaced / deleted / given a sibling key."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(tree, dict):
        new = dict(tree)
        if rest:
            new[head] = _set(tree[head], rest, value, op)
        elif op == "delete":
            del new[head]
        elif op == "extra":
            new["fuzz_unknown_key"] = value
        else:
            new[head] = value
        return new
    new_list = list(tree)
    if rest:
        new_list[head] = _set(tree[head], rest, value, op)
    elif op == "delete":
        del new_list[head]
    elif op == "extra":
        new_list.append(value)
    else:
        new_list[head] = value
    return new_list


class _NoAliases(yaml.SafeDumper):
    """Shared subtrees written out in full: aliases only where a case puts them on purpose."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump(tree: Any) -> str:
    return yaml.dump(tree, Dumper=_NoAliases, sort_keys=False, allow_unicode=True, width=10_000)


def dump_with_raw(tree: Any, raw: str) -> str:
    """YAML text of `tree`, its `RAW` placeholder replaced by the raw YAML text `raw`."""
    return dump(tree).replace(RAW, raw)


@st.composite
def mutated_yaml(draw: st.DrawFn, tree: Any, heavy: bool = False) -> str:
    """The YAML text of `tree` with one node made hostile (1-2 mutations)."""
    all_paths = paths(tree)
    for _ in range(draw(st.integers(1, 2))):
        path = draw(st.sampled_from(all_paths)) if all_paths else ()
        op = draw(st.sampled_from(["replace", "replace", "replace", "delete", "extra", "wrap"]))
        if op == "wrap" and path:
            node: Any = tree
            for k in path:
                node = node[k]
            tree = _set(tree, path, [node], "replace")
        elif path or op == "replace":
            tree = _set(tree, path, RAW, op)
        all_paths = paths(tree)
    raw = draw(st.sampled_from(HEAVY)) if heavy else draw(hostile_text)
    return dump_with_raw(tree, raw)


@st.composite
def damaged_bytes(draw: st.DrawFn, data: bytes) -> bytes:
    """`data` truncated, with garbage inserted, bytes flipped, a BOM, or replaced entirely."""
    op = draw(
        st.sampled_from(
            ["truncate", "insert", "flip", "bom", "binary", "empty", "nul", "latin1", "crlf"]
        )
    )
    n = len(data)
    at = draw(st.integers(0, max(n - 1, 0)))
    if op == "truncate":
        return data[:at]
    if op == "insert":
        return data[:at] + draw(st.binary(min_size=1, max_size=64)) + data[at:]
    if op == "flip":
        b = bytearray(data)
        for i in draw(st.lists(st.integers(0, max(n - 1, 0)), min_size=1, max_size=8)):
            if b:
                b[i] ^= draw(st.integers(1, 255))
        return bytes(b)
    if op == "bom":
        return draw(st.sampled_from([b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff"])) + data
    if op == "binary":
        return draw(st.binary(min_size=1, max_size=512))
    if op == "nul":
        return data[:at] + b"\x00" * draw(st.integers(1, 16)) + data[at:]
    if op == "latin1":
        return data[:at] + "é".encode("latin-1") + data[at:]
    if op == "crlf":
        return data.replace(b"\n", b"\r\n")
    return b""


# Values for `--set KEY=VALUE` and numeric options.
OPTION_NUMBERS = [
    "inf",
    "-inf",
    "nan",
    "NaN",
    "1e308",
    "1e309",
    "-1",
    "0",
    "-0",
    "1e-320",
    str(2**63),
    str(2**64),
    "9" * 400,
    "abc",
    "",
    " ",
    "1,5",
    "0x10",
    "1e",
    "--",
    "\u0661",  # an Arabic-Indic digit one
]
