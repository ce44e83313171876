"""Readers for user files: bounded, UTF-8-checked YAML (specs, deployments, calibrations) and
JSON (model `config.json`, JSONL trace lines).

Why one module: every file a user hands over is untrusted, and the checks must not depend on
which command reads it. Each reader refuses, with one `InputError` line naming the file and the
line: bytes that are not UTF-8 text (or hold NUL bytes), files over `MAX_FILE_BYTES`, nesting
deeper than `MAX_DEPTH`, more than `MAX_ALIASES` YAML aliases or a document that would expand
to more than `MAX_NODES` nodes (checked while composing, before anything is constructed, so an
alias bomb costs nothing), integers beyond 64 bits and non-finite JSON numbers. YAML keeps
`yaml.safe_load` semantics: tags other than the plain data ones are refused. Messages never
echo more than `MAX_SHOWN` characters of the input.
"""

from __future__ import annotations

import codecs
import json
import math
import reprlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

from phaselens.errors import InputError
from phaselens.inputs.bounds import limit

# Each can be raised with PHASELENS_LIMIT_<NAME> (`bounds.py`): YAML_BYTES, DEPTH, ALIASES, NODES.
MAX_FILE_BYTES = limit("YAML_BYTES", 16 * 1024 * 1024)  # YAML and config.json (traces stream)
MAX_DEPTH = limit("DEPTH", 64)  # nested mappings/lists (YAML and JSON)
MAX_ALIASES = limit("ALIASES", 100)  # YAML `*name` references in one document
MAX_NODES = limit("NODES", 200_000)  # YAML nodes of one document, every alias expanded
MAX_SHOWN = 200  # characters of input a message may quote
MAX_INT_DIGITS = 19  # JSON integers: int64 at most


# ---------------------------------------------------------------- short, safe reprs
class _Repr(reprlib.Repr):
    def repr_int(self, x: int, level: int) -> str:
        digits = len(str(abs(x))) if x.bit_length() < 14_000 else int(math.log10(abs(x))) + 1
        return f"<a {digits}-digit integer>" if digits > 30 else str(x)


_REPR = _Repr()
_REPR.maxstring = 60
_REPR.maxother = 60
_REPR.maxlist = _REPR.maxtuple = _REPR.maxset = 6
_REPR.maxdict = 4
_REPR.maxlevel = 3


def show(value: Any) -> str:
    """A repr for messages: bounded in length, whatever the value (huge ints and lists too)."""
    return clip(_REPR.repr(value), 80)


def clip(text: str, limit: int = MAX_SHOWN) -> str:
    """`text` cut to `limit` characters, saying how long it was."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


# ---------------------------------------------------------------- text
def _line_of(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def decode_text(data: bytes, source: str, line0: int = 1) -> str:
    """UTF-8 text, or one line naming the line and byte offset of the first bad byte."""
    nul = data.find(b"\x00")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = e.start if nul < 0 else min(e.start, nul)
        _not_text(source, _line_of(data, bad) + line0 - 1, bad, nul=bad == nul)
    if nul >= 0:
        _not_text(source, _line_of(data, nul) + line0 - 1, nul, nul=True)
    return text.removeprefix("\ufeff")


def read_text(path: str | Path, kind: str, max_bytes: int = MAX_FILE_BYTES) -> str:
    """The whole file as text: must exist, be a file, at most `max_bytes`, UTF-8, no NUL."""
    p = Path(path)
    try:
        if p.is_dir():
            raise InputError(f"{p}: is a directory; expected a {kind} file")
        if not p.is_file():
            if p.exists():  # a device, a FIFO, a socket: reading it may never end
                raise InputError(f"{p}: not a regular file; expected a {kind} file")
            raise InputError(f"{p}: {kind} file not found")
        with open(p, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise InputError(f"{p}: cannot read ({e.strerror or e})") from None
    except ValueError as e:  # an embedded NUL in the path
        raise InputError(f"{clip(repr(str(p)), 80)}: not a usable path ({e})") from None
    if len(data) > max_bytes:
        raise InputError(
            f"{p}: larger than {max_bytes // (1024 * 1024)} MiB (limit {max_bytes:,} bytes); "
            f"a {kind} file is small text"
        )
    return decode_text(data, str(p))


def check_text_file(path: str | Path, chunk: int = 1 << 20) -> None:
    """Stream a (possibly large) file and refuse it when it is not UTF-8 text or holds NULs."""
    p = Path(path)
    dec = codecs.getincrementaldecoder("utf-8")()
    offset, line = 0, 1  # of the current block's first byte
    try:
        with open(p, "rb") as f:
            while block := f.read(chunk):
                nul = block.find(b"\x00")
                pending = len(dec.getstate()[0])
                try:
                    dec.decode(block if nul < 0 else block[:nul], final=nul >= 0)
                except UnicodeDecodeError as e:
                    at = max(e.start - pending, 0)
                    _not_text(p, line + block.count(b"\n", 0, at), offset + at)
                if nul >= 0:
                    _not_text(p, line + block.count(b"\n", 0, nul), offset + nul, nul=True)
                offset += len(block)
                line += block.count(b"\n")
            dec.decode(b"", final=True)
    except UnicodeDecodeError:
        _not_text(p, line, offset - len(dec.getstate()[0]))
    except OSError as e:
        raise InputError(f"{p}: cannot read ({e.strerror or e})") from None


def _not_text(source: str | Path, line: int, offset: int, nul: bool = False) -> NoReturn:
    what = "binary data (a NUL byte at" if nul else "not UTF-8 text (a bad byte at"
    raise InputError(f"{source}: line {line}: {what} byte offset {offset}); expected text")


# ---------------------------------------------------------------- YAML
class _LimitError(yaml.MarkedYAMLError):
    """A bound of this module exceeded while composing (reported with its line)."""


if yaml.__with_libyaml__:  # libyaml's scanner and parser (C), composed here in Python
    from yaml._yaml import CParser

    class _SafeBase(Composer, CParser, SafeConstructor, Resolver):
        """`yaml.SafeLoader`'s composer, constructor and resolver on libyaml's event parser.

        Why: the pure-Python scanner takes ~50 s for a 7 MB, million-node spec before the
        node limit refuses it; libyaml's parser ~4x less, and the compose hooks still count.
        """

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)

else:  # pragma: no cover - PyYAML built without libyaml
    _SafeBase = yaml.SafeLoader  # type: ignore[misc,assignment]


class BoundedLoader(_SafeBase):
    """A safe loader that counts depth, aliases and expanded nodes while composing."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._frames: list[int] = [0]  # expanded sizes of the children of each open node
        self._sizes: dict[int, int] = {}  # id(node) -> expanded size, once complete

    def _grow(self, size: int, mark: Any) -> None:
        self._frames[-1] += size
        if self._frames[-1] > MAX_NODES:
            raise _LimitError(
                None, None, f"the document expands to more than {MAX_NODES:,} nodes", mark
            )

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        mark: Any = self.peek_event().start_mark  # type: ignore[union-attr]
        if self.check_event(AliasEvent):
            node: Node | None = super().compose_node(parent, index)
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise _LimitError(None, None, f"more than {MAX_ALIASES} aliases (*name)", mark)
            size = self._sizes.get(id(node))
            if node is None or size is None:
                raise _LimitError(None, None, "an alias inside the node it names", mark)
            self._grow(size, mark)
            return node
        if len(self._frames) > MAX_DEPTH:
            raise _LimitError(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)
        self._frames.append(0)
        node = super().compose_node(parent, index)
        assert node is not None
        size = 1 + self._frames.pop()
        self._sizes[id(node)] = size
        self._grow(size, mark)
        return node

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as e:  # int("9" * 5000), a 13th month
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"cannot read this value ({clip(str(e).split(':')[0], 80)})",
                node.start_mark,
            ) from None


def _yaml_error(e: yaml.YAMLError, text: str, source: str, kind: str) -> InputError:
    if isinstance(e, yaml.reader.ReaderError):
        n = text.count("\n", 0, max(e.position, 0)) + 1
        return InputError(
            f"{source}: line {n}: invalid YAML (control character #x{e.character:04x} "
            "is not allowed)"
        )
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    line = f"line {mark.line + 1}: " if mark is not None else ""
    problem = str(getattr(e, "problem", None) or str(e).splitlines()[0])
    if isinstance(e, yaml.constructor.ConstructorError) and "tag" in problem:
        tag = problem.split("tag '", 1)[-1].split("'", 1)[0]
        name = tag.replace("tag:yaml.org,2002:", "!!")
        return InputError(
            f"{source}: {line}YAML tag {clip(name, 60)!r} is not allowed; a {kind} holds "
            "plain data only (mappings, lists, numbers, strings)"
        )
    return InputError(f"{source}: {line}invalid YAML ({clip(problem, 120)})")


def parse_yaml(text: str, source: str, kind: str = "spec") -> Any:
    """Parse YAML text (a file's content or a `--set` value) within this module's bounds."""
    if len(text) > MAX_FILE_BYTES:
        raise InputError(f"{source}: larger than {MAX_FILE_BYTES:,} characters")
    loader: BoundedLoader | None = None
    try:
        loader = BoundedLoader(text)
        return loader.get_single_data()
    except yaml.YAMLError as e:
        raise _yaml_error(e, text, source, kind) from None
    except RecursionError:
        raise InputError(f"{source}: nested too deeply (limit {MAX_DEPTH} levels)") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml(path: str | Path, kind: str) -> Any:
    """Read and parse one YAML file of `kind` (spec, deployment, calibration)."""
    return load_yaml_doc(path, kind).data


# A field path (`("models", 0, "rate")`) -> the 1-based line it is written on, or None.
LineOf = Callable[[Sequence[str | int]], "int | None"]


@dataclass(frozen=True)
class YamlDoc:
    """A parsed YAML file that can say on which line a field path is written.

    Why: a validation error (`models[0].rate: must be > 0`) names the field; in a 300-line
    deployment the line finds it faster. The text is composed again only when a line is asked
    for (on the error path), so a valid file costs one parse.
    """

    data: Any
    source: str
    text: str

    def line(self, loc: Sequence[str | int]) -> int | None:
        """The line of the deepest part of `loc` the file holds (parts it lacks, e.g. pydantic's
        union tags or a missing field, are skipped); None when not even the first is there."""
        if not loc:
            return None
        loader = BoundedLoader(self.text)
        try:
            node: Node | None = loader.get_single_node()
        except yaml.YAMLError:  # pragma: no cover - the same text parsed once already
            return None
        finally:
            loader.dispose()
        line = None
        for part in loc:
            if isinstance(node, MappingNode):
                hits = [
                    (k, v)
                    for k, v in node.value
                    if isinstance(k, ScalarNode) and k.value == str(part)
                ]
                if hits:  # the last of duplicate keys is the one constructed
                    line, node = hits[-1][0].start_mark.line + 1, hits[-1][1]
            elif (
                isinstance(node, SequenceNode)
                and isinstance(part, int)
                and 0 <= part < len(node.value)
            ):
                node = node.value[part]
                line = node.start_mark.line + 1
        return line

    def under(self, *prefix: str | int) -> LineOf:
        """`line` for the mapping at `prefix` (a deployment inside a calibration file)."""
        return lambda loc: self.line((*prefix, *loc))


def load_yaml_doc(path: str | Path, kind: str) -> YamlDoc:
    """`load_yaml`, keeping the text so that errors can name lines (`YamlDoc.line`)."""
    p = Path(path)
    text = read_text(p, kind)
    return YamlDoc(parse_yaml(text, str(p), kind), str(p), text)


# ---------------------------------------------------------------- JSON
def _json_int(s: str) -> int:
    if len(s.lstrip("-")) > MAX_INT_DIGITS or not -(2**63) <= int(s) < 2**63:
        raise _JsonNumberError(f"integer {clip(s, 30)} is out of range (64 bits at most)")
    return int(s)


def _json_float(s: str) -> float:
    v = float(s)
    if not math.isfinite(v):
        raise _JsonNumberError(f"number {clip(s, 30)} is out of range")
    return v


def _json_constant(s: str) -> float:
    raise _JsonNumberError(f"{s} is not a number JSON allows")


class _JsonNumberError(ValueError):
    pass


def _depth_ok(text: str) -> bool:
    """Whether brackets outside strings nest at most MAX_DEPTH deep (cheap pre-check)."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return True
    depth, in_str, esc = 0, False, False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return False
        elif ch in "]}":
            depth -= 1
    return True


def loads_json(text: str, source: str, line: int | None = None) -> Any:
    """Parse JSON (a file or one JSONL line): ints within 64 bits, finite numbers, bounded depth."""
    where = f"{source}: line {line}" if line is not None else source
    if not _depth_ok(text):
        raise InputError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(
            text, parse_int=_json_int, parse_float=_json_float, parse_constant=_json_constant
        )
    except json.JSONDecodeError as e:
        at = f"{source}: line {e.lineno}" if line is None else where
        raise InputError(f"{at}: invalid JSON ({clip(e.msg, 80)})") from None
    except _JsonNumberError as e:
        raise InputError(f"{where}: {e}") from None
    except (ValueError, RecursionError) as e:
        raise InputError(f"{where}: invalid JSON ({clip(str(e), 80)})") from None
