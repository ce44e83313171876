"""Run directories as untrusted input: every file checked once, when the run is loaded.

Why: a run directory may be truncated, copied halfway, edited by hand or written by another
phaselens version. Analysis trusts what `load_run` hands it, so every problem is found here and
becomes one `InputError` naming the file (with the line of events.jsonl, the column of a Parquet
file or the key path of manifest.json) and what was expected. The schemas themselves live in
`rundir.schema` (which reads `NOT_NULL` from here); this module imports only `errors` and
`inputs.bounds`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
from polars.exceptions import PanicException

from phaselens.errors import InputError
from phaselens.inputs.bounds import limit

FORMAT = 1  # the newest run format this version reads (and the one it writes)
RUN_STATUSES = ("running", "complete", "partial", "interrupted")
MAX_MANIFEST_BYTES = 64 << 20  # a manifest is a few kB (PHASELENS_LIMIT_MANIFEST_BYTES raises it)
I64_RANGE = (-(2**63), 2**63 - 1)
I32_RANGE = (-(2**31), 2**31 - 1)


class RunFormatError(InputError):
    """The directory is not a readable phaselens run (one clear line for the CLI)."""


def describe(v: Any) -> str:
    """A value as quoted in a message: its type and a clipped repr."""
    if isinstance(v, int) and v.bit_length() > 256:
        return f"an integer of {v.bit_length()} bits"
    r = repr(v)
    return f"{type(v).__name__} {r[:60]}{'…' if len(r) > 60 else ''}"


# ---- manifest.json -----------------------------------------------------------------------------
Check = Callable[[Any], str | None]  # None: fine; else what was expected


def int_check(lo: int = I64_RANGE[0], hi: int = I64_RANGE[1]) -> Check:
    what = "an integer" if (lo, hi) == I64_RANGE else f"an integer in [{lo}, {hi}]"
    if hi == I64_RANGE[1] and lo != I64_RANGE[0]:
        what = f"an integer >= {lo}"

    def c(v: Any) -> str | None:
        ok = isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi
        return None if ok else what

    return c


def _num(v: Any) -> str | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, int):
        return None if I64_RANGE[0] <= v <= I64_RANGE[1] else "a number below 2^63"
    return None if math.isfinite(v) else "a finite number"


def _str(v: Any) -> str | None:
    return None if isinstance(v, str) else "a string"


def _bool(v: Any) -> str | None:
    return None if isinstance(v, bool) else "true or false"


def _any(v: Any) -> str | None:
    return None


def _opt(c: Check) -> Check:
    return lambda v: None if v is None else c(v)


@dataclass(frozen=True, slots=True)
class _Obj:
    """A JSON object whose known keys have checks (unknown keys pass; `required` must be there)."""

    fields: Mapping[str, Check | _Obj | _List | _Map]
    required: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _List:
    item: Check | _Obj | _List | _Map


@dataclass(frozen=True, slots=True)
class _Map:
    value: Check | _Obj | _List | _Map


_Spec = Check | _Obj | _List | _Map


def _check(spec: _Spec, v: Any, where: str, f: Path) -> None:
    if isinstance(spec, _Obj):
        if not isinstance(v, dict):
            raise RunFormatError(f"{f}: {where}: expected a JSON object, got {describe(v)}")
        for k in spec.required:
            if k not in v:
                raise RunFormatError(f"{f}: {where}: missing key {k!r}")
        for k, sub in spec.fields.items():
            if k in v:
                _check(sub, v[k], f"{where}.{k}".lstrip("."), f)
    elif isinstance(spec, _List):
        if not isinstance(v, list):
            raise RunFormatError(f"{f}: {where}: expected a JSON list, got {describe(v)}")
        for i, x in enumerate(v):
            _check(spec.item, x, f"{where}[{i}]", f)
    elif isinstance(spec, _Map):
        if not isinstance(v, dict):
            raise RunFormatError(f"{f}: {where}: expected a JSON object, got {describe(v)}")
        for k, x in v.items():
            _check(spec.value, x, f"{where}.{k}".lstrip("."), f)
    else:
        why = spec(v)
        if why is not None:
            raise RunFormatError(f"{f}: {where}: expected {why}, got {describe(v)}")


# Every key some reader uses, with the type it relies on (docs/run-format.md). Others pass.
MANIFEST_SPEC = _Obj(
    {
        "format": int_check(1),
        "status": lambda v: None if v in RUN_STATUSES else "one of " + ", ".join(RUN_STATUSES),
        "name": _str,
        "kind": _str,
        "target": _str,
        "token_count_method": _str,
        "targets": _Map(_str),
        "spec": _Obj(
            {
                "name": _str,
                "seed": int_check(),
                "models": _List(_any),
                "gpu_cost_per_hour": _opt(_num),
            }
        ),
        "slo": _Map(_any),  # checked by _check_slo (a number or {stat: number})
        "classes": _Map(_Map(_any)),  # flow-control classes (issue 30): name -> their rules
        "class_slo": _Map(_Map(_any)),  # name -> an slo block, checked by _check_slo
        "stages": _List(
            _Obj(
                {
                    "index": int_check(),
                    "rate_scale": _num,
                    "t_start_ns": int_check(),
                    "t_end_ns": int_check(),
                },
                required=("index", "rate_scale", "t_start_ns", "t_end_ns"),
            )
        ),
        "clock": _Map(int_check()),
        "valid": _bool,
        "invalid_reasons": _List(_str),
        "gpus": _List(
            _Obj(
                {
                    "name": _opt(_str),
                    "tflops": _opt(_num),
                    "bandwidth_gbs": _opt(_num),
                    "memory_gb": _opt(_num),
                }
            )
        ),
        "engines": _List(_Obj({"name": _str, "model": _str, "serves": _List(_str)})),
        "sim": _Obj(
            {
                "engines": _Map(_Obj({"prefix_hit_rate": _num})),
                "cost_params": _Obj({"eta_linear": _num}),
            }
        ),
        "counts": _Map(int_check(0)),
        "telemetry": _Map(_str),
        "pid": int_check(1, 2**31 - 1),
        "host": _Obj({"hostname": _str}),
        "gpu_cost_per_hour": _opt(_num),
        "driver": _Obj({"loop": _str}),
        "schedule": _Obj({"requests": int_check(0)}),
        # --profile windows and the timeline built from them (timeline/build.py reads these)
        "profile": _Obj(
            {
                "windows": _List(
                    _Obj(
                        {
                            "name": _str,
                            "start_ns": _opt(int_check()),
                            "stop_ns": _opt(int_check()),
                            "files": _List(_Obj({"path": _str}, required=("path",))),
                            "request": _Obj(
                                {
                                    "sent_ns": _opt(int_check()),
                                    "first_token_ns": _opt(int_check()),
                                    "end_ns": _opt(int_check()),
                                }
                            ),
                        },
                        required=("name",),
                    )
                )
            }
        ),
        "timeline": _Obj(
            {
                "traces": _List(_Obj({"window": _str, "path": _str}, required=("window", "path"))),
                "roofline": _Obj({"gpu": _str, "model": _Map(_any)}),
            }
        ),
    }
)


def _check_slo(slo: Mapping[str, Any], f: Path) -> None:
    for metric, v in slo.items():
        if isinstance(v, dict):
            for stat, thr in v.items():
                _check(_opt(_num), thr, f"slo.{metric}.{stat}", f)
        else:
            _check(_opt(_num), v, f"slo.{metric}", f)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_manifest(path: Path) -> dict[str, Any]:
    """manifest.json of `path`, checked: a JSON object of the known keys' types, our format."""
    mf = path / "manifest.json"
    if not path.is_dir():
        raise RunFormatError(f"{path}: not a phaselens run (not a directory)")
    if not mf.is_file():
        raise RunFormatError(f"{path}: not a phaselens run (no manifest.json)")
    top = limit("MANIFEST_BYTES", MAX_MANIFEST_BYTES)
    try:
        with open(mf, "rb") as fh:
            raw = fh.read(top + 1)
    except OSError as e:
        raise RunFormatError(f"{mf}: cannot read ({e.strerror or e})") from None
    if len(raw) > top:
        raise RunFormatError(
            f"{mf}: over the limit of {top:,} bytes for a manifest "
            "(raise it with PHASELENS_LIMIT_MANIFEST_BYTES=N)"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RunFormatError(f"{mf}: not UTF-8 text (byte {e.start})") from None
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise RunFormatError(f"{mf}: line {e.lineno}: invalid JSON ({e.msg})") from None
    except RecursionError:
        raise RunFormatError(f"{mf}: invalid JSON (nested too deeply)") from None
    except ValueError as e:  # NaN/Infinity, integers past Python's 4300-digit limit
        why = "an integer too long" if "digits" in str(e) else str(e)[:80]
        raise RunFormatError(f"{mf}: invalid JSON ({why})") from None
    if not isinstance(data, dict):
        raise RunFormatError(f"{mf}: expected a JSON object, got {describe(data)}")
    fmt = data.get("format", 1)
    if isinstance(fmt, int) and not isinstance(fmt, bool) and fmt > FORMAT:
        raise RunFormatError(
            f"{mf}: format {fmt}: made by a newer phaselens (this version reads format "
            f"{FORMAT}); upgrade phaselens to read it"
        )
    _check(MANIFEST_SPEC, data, "", mf)
    _check_slo(data.get("slo") or {}, mf)
    for cls_slo in (data.get("class_slo") or {}).values():
        _check_slo(cls_slo, mf)
    return data


# ---- Parquet files -----------------------------------------------------------------------------
NOT_NULL: Mapping[str, tuple[str, ...]] = {
    "requests.parquet": ("id", "model", "stage", "scheduled_ns", "status"),
    "telemetry.parquet": ("t_ns", "source", "metric", "labels"),
    "steps.parquet": ("t_start_ns", "t_end_ns", "engine", "gpu"),
    "schedule.parquet": ("id", "model", "stage", "t_ns", "input_tokens", "priority"),
    "phases.parquet": ("id", "engine"),
    "timeline.parquet": ("window", "rank", "step", "phase", "t_start_ns", "t_end_ns"),
    "timeline_gaps.parquet": ("window", "rank", "step", "t_start_ns", "t_end_ns", "cause"),
}


def _fits(got: Any, want: Any) -> bool:  # polars data types (instances or classes)
    """Same type, or a narrower integer / float type of the same kind, or all-null."""
    if got == want or got == pl.Null():
        return True
    if isinstance(want, pl.List):
        return isinstance(got, pl.List) and _fits(got.inner, want.inner)
    if want.is_integer():
        return bool(got.is_integer()) and _int_width(got) <= _int_width(want)
    if want.is_float():
        return bool(got.is_float())
    if want == pl.String():  # a dictionary-encoded text column is still text
        return isinstance(got, (pl.Categorical, pl.Enum)) or got in (pl.Categorical, pl.Enum)
    return False


_INT_BITS = {"Int8": 8, "Int16": 16, "Int32": 32, "Int64": 64, "UInt8": 9, "UInt16": 17}
_INT_BITS["UInt32"] = 33  # unsigned: one bit more than its width as a signed type


def _int_width(t: pl.DataType) -> int:
    return _INT_BITS.get(str(t), 128)


def read_frame(
    f: Path, schema: Mapping[str, pl.DataType], optional: tuple[str, ...] = ()
) -> pl.DataFrame:
    """A Parquet file of the run in exactly `schema` (columns in order; `optional` ones absent in
    older runs become null), or one line saying what is wrong with it."""
    if not f.is_file():
        raise RunFormatError(f"{f}: not a regular file")
    try:
        df = pl.read_parquet(f)
    except (Exception, PanicException) as e:
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise RunFormatError(f"{f}: not a readable Parquet file ({why})") from None
    types = dict(zip(df.columns, df.dtypes, strict=True))
    for k, t in schema.items():
        if k not in df.columns:
            if k not in optional:
                raise RunFormatError(f"{f}: column {k!r} missing (expected {t})")
        elif not _fits(types[k], t):
            raise RunFormatError(f"{f}: column {k!r}: expected {t}, got {types[k]}")
    df = df.select(
        (pl.col(k).cast(t) if k in df.columns else pl.lit(None, dtype=t).alias(k))
        for k, t in schema.items()
    )
    check_values(f, df)
    return df


def check_values(f: Path, df: pl.DataFrame) -> None:
    """What analysis relies on beyond types: keys present, one row per id, token lists paired."""
    for c in NOT_NULL.get(f.name, ()):
        if c in df.columns and df[c].null_count():
            row = int(df[c].is_null().arg_max() or 0)
            raise RunFormatError(f"{f}: column {c!r}: null in row {row}; expected a value")
    if "id" in df.columns and df["id"].n_unique() != df.height:
        dup = df.filter(df["id"].is_duplicated())["id"][0]
        raise RunFormatError(f"{f}: column 'id': id {dup} appears twice; expected one row each")
    if "token_ns" in df.columns and df.height:
        a, b = df["token_ns"].list.len().fill_null(0), df["token_counts"].list.len().fill_null(0)
        bad = a != b
        if bad.any():
            rid = df.filter(bad)["id"][0]
            raise RunFormatError(
                f"{f}: request {rid}: token_ns and token_counts differ in length; expected one "
                "count per chunk time"
            )
    if "labels" in df.columns:
        for lab in df["labels"].unique().drop_nulls().to_list():
            try:
                obj = json.loads(lab)
            except (ValueError, RecursionError):
                obj = None
            if not isinstance(obj, dict):
                raise RunFormatError(f"{f}: column 'labels': {lab[:60]!r}; expected a JSON object")
