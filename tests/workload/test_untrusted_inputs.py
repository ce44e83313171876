"""Untrusted specs, `--set` values and traces: refused in one line (exit 2), never a traceback.

The YAML reader (`yamlio`) is exercised directly (alias bomb, depth, binary bytes, huge ints,
file size), then the same inputs go through `phaselens plan`/`run` in process (`cli.invoke`)
and, for a few, in a real subprocess (`python -m phaselens.cli`). Hypothesis feeds random bytes
and random numbers; the property is always: exit 0 with sane output, or exit 2 with exactly one
`phaselens: error:` line naming the file and the field or line.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst
from untrusted_helpers import BOMB, GOOD, HYPO, TRACE_SPEC, call, one_error_line, plan_text

from phaselens.errors import InputError
from phaselens.inputs.names import slugify
from phaselens.inputs.yamlio import (
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_NODES,
    load_yaml,
    loads_json,
    parse_yaml,
)
from phaselens.workload.spec import MAX_STAGES, ramp_scale


# ---------------------------------------------------------------- the YAML reader
def test_alias_bomb_is_refused_before_it_expands() -> None:
    assert len(BOMB) < 700
    t0 = time.monotonic()
    with pytest.raises(InputError) as e:
        parse_yaml(BOMB, "bomb.yaml")
    assert time.monotonic() - t0 < 10.0  # was 41 s and 1.6 GB; composing stops at the limit
    # line k holds about 9^k expanded nodes: the limit is crossed on line 6 (9^5 < it < 9^6)
    assert 9**5 < MAX_NODES < 9**6
    assert str(e.value) == (
        f"bomb.yaml: line 6: invalid YAML (the document expands to more than {MAX_NODES:,} nodes)"
    )


def test_a_huge_plain_spec_is_refused_at_the_node_limit_quickly() -> None:
    # 100,000 stages of 5 nodes each, no aliases (7 MB of YAML took ~50 s in the pure-Python
    # scanner): refused at the node limit, in one line, with the line where it was reached
    text = "name: b\nstages:\n" + "- {rate_scale: 1.0, duration_s: 1}\n" * 100_000
    t0 = time.monotonic()
    with pytest.raises(InputError, match=r"^big\.yaml: line \d+: .*more than [\d,]+ nodes"):
        parse_yaml(text, "big.yaml")
    assert time.monotonic() - t0 < 30.0  # ~2 s here; generous for a loaded 2-core machine


def test_aliases_are_counted_and_may_not_recurse() -> None:
    ok = "- &a x\n" + "- *a\n" * 100
    assert parse_yaml(ok, "f.yaml") == ["x"] * 101
    with pytest.raises(InputError, match=r"^f\.yaml: line 102: .*more than 100 aliases"):
        parse_yaml(ok + "- *a\n", "f.yaml")
    with pytest.raises(InputError, match=r"^f\.yaml: line 1: .*alias inside the node it names"):
        parse_yaml("a: &a [1, *a]", "f.yaml")


def test_nesting_depth_limit_is_exact() -> None:
    # depth counts nodes from the root: 63 lists + the scalar = 64 levels
    deep = "[" * (MAX_DEPTH - 1) + "1" + "]" * (MAX_DEPTH - 1)
    value = parse_yaml(deep, "d.yaml")
    for _ in range(MAX_DEPTH - 1):
        value = value[0]
    assert value == 1
    with pytest.raises(InputError, match=r"^d\.yaml: line 1: .*nested deeper than 64 levels"):
        parse_yaml("[" + deep + "]", "d.yaml")
    block = "".join(f"{'  ' * k}k{k}:\n" for k in range(100)) + "  " * 100 + "v\n"
    with pytest.raises(InputError, match=r"^b\.yaml: line 64: .*nested deeper than 64"):
        parse_yaml(block, "b.yaml")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"a: 1\n\xff\xfe junk", "line 2: not UTF-8 text (a bad byte at byte offset 5)"),
        (b"a: 1\nb: 2\x00\n", "line 2: binary data (a NUL byte at byte offset 9)"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "line 1: not UTF-8 text (a bad byte at byte offset 0)"),
        (b"a: 1\nb: \x01\n", "line 2: invalid YAML (control character #x0001 is not allowed)"),
        (b"x: " + b"9" * 5000, "line 1: invalid YAML (cannot read this value (Exceeds the limit"),
        (b"x: 2001-13-45", "line 1: invalid YAML (cannot read this value (month must be"),
        (b"a: [1,\n", "line 2: invalid YAML"),
    ],
)
def test_bad_yaml_files_name_file_and_line(tmp_path: Path, data: bytes, expected: str) -> None:
    p = tmp_path / "f.yaml"
    p.write_bytes(data)
    with pytest.raises(InputError) as e:
        load_yaml(p, "spec")
    assert str(e.value).startswith(f"{p}: {expected}"), str(e.value)


def test_file_size_limit_and_messages_are_short(tmp_path: Path) -> None:
    p = tmp_path / "big.yaml"
    p.write_bytes(b"#" * (MAX_FILE_BYTES + 1))
    with pytest.raises(InputError, match=r"larger than 16 MiB \(limit 16,777,216 bytes\)"):
        load_yaml(p, "spec")
    with pytest.raises(InputError) as e:  # a 1 MB line in error: the message quotes little
        parse_yaml("a: b: " + "c" * 1_000_000, "long.yaml")
    assert len(str(e.value)) < 300


def test_json_numbers_and_depth_are_bounded() -> None:
    assert loads_json('{"a": 9223372036854775807, "b": -9223372036854775808}', "t") == {
        "a": 2**63 - 1,
        "b": -(2**63),
    }
    for text, expected in [
        ('{"a": 9223372036854775808}', "t: line 4: integer 9223372036854775808 is out of range"),
        ('{"a": ' + "7" * 400 + "}", "t: line 4: integer 777777777777777777777777777777..."),
        ('{"a": ' + "7" * 5000 + "}", "t: line 4: integer 777"),
        ('{"a": NaN}', "t: line 4: NaN is not a number JSON allows"),
        ('{"a": -Infinity}', "t: line 4: -Infinity is not a number JSON allows"),
        ('{"a": 1e400}', "t: line 4: number 1e400 is out of range"),
        ("[" * 5000 + "]" * 5000, "t: line 4: JSON nested deeper than 64 levels"),
        ('{"a" 1}', "t: line 4: invalid JSON (Expecting ':' delimiter)"),
    ]:
        with pytest.raises(InputError) as e:
            loads_json(text, "t", 4)
        assert str(e.value).startswith(expected), str(e.value)
        assert len(str(e.value)) < 200


@HYPO
@given(data=hst.binary(max_size=300))
def test_any_bytes_load_or_fail_in_one_line(tmp_path: Path, data: bytes) -> None:
    p = tmp_path / "fuzz.yaml"
    p.write_bytes(data)
    try:
        load_yaml(p, "spec")
    except InputError as e:
        msg = str(e)
        assert msg.startswith(f"{p}: ") and len(msg) < 400


@HYPO
@given(text=hst.text(alphabet="[]{}&*:-,!'\"\n ab01#|>.%@", max_size=200))
def test_yamlish_text_loads_or_fails_in_one_line(text: str) -> None:
    try:
        parse_yaml(text, "t.yaml")
    except InputError as e:
        assert str(e).startswith("t.yaml: ") and len(str(e)) < 400


# ---------------------------------------------------------------- numbers in specs and --set
@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("models[0].rate=.nan", "models[0].rate: must be a finite number (got nan)"),
        ("models[0].rate=.inf", "models[0].rate: must be a finite number (got inf)"),
        ("models[0].rate=-.inf", "models[0].rate: must be a finite number (got -inf)"),
        ("models[0].rate=1.0e+308", "models[0].rate: must be <= 1,000,000,000 (got 1e+308)"),
        ("duration_s=1.0e+308", "duration_s: must be <= 2,592,000 (got 1e+308)"),
        (
            "models[0].input_tokens.value=18446744073709551616",
            "models[0].input_tokens.value: must be <= 10,000,000 (got 18446744073709551616)",
        ),
        (
            "models[0].priority=18446744073709551616",
            "models[0].priority: must be <= 2,147,483,647 (got 18446744073709551616)",
        ),
        ("seed=18446744073709551616", "seed: must be <= 9,223,372,036,854,775,807"),
        ("seed=0x" + "f" * 5000, "seed: must be <= 9,223,372,036,854,775,807 (got <a 6021-digit"),
        ("seed=" + "9" * 5000, "--set seed=999"),
        (
            "models[0].output_tokens={type: lognormal, median: 10, sigma: 1.0e+3}",
            "models[0].output_tokens.sigma: must be <= 10 (got 1000.0)",
        ),
        ("models[0].arrival={type: gamma, cv: 1.0e-300}", "models[0].arrival.cv: must be >= 0.001"),
        ("slo.ttft_ms={p90: .nan}", "slo.ttft_ms.p90: must be a finite number (got nan)"),
        ("stages=[{rate_scale: .inf, duration_s: 1}]", "stages[0].rate_scale: must be a finite"),
        (
            "stages=[{rate_scale: 1, duration_s: 2000000}, {rate_scale: 1, duration_s: 2000000}]",
            "stages: the stages last 4,000,000 s in all; limit 2,592,000 s",
        ),
        ('name="a\\0b"', "name: must not contain control characters"),
        ("name=" + "n" * 300, "name: expected at most 200 characters (got 'nnnnn"),
        ("duration_s=0.001", "the spec plans no requests"),
        (
            "models[0].arrival={type: onoff, burst_ratio: 2, burst_s: 1.0e-9, quiet_s: 1.0e-9}",
            "models[0].arrival: burst_s + quiet_s = 2e-09 s over a 5 s window means about "
            "5,000,000,000 burst and quiet periods; limit 10,000,000",
        ),
    ],
)
def test_bad_numbers_are_one_line_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, expected: str
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(GOOD)
    code, out, err = call(["plan", str(spec), "--json", "--set", override], capsys)
    line = one_error_line(code, err)
    assert expected in line, line
    assert out == "" and len(line) < 400


def test_stage_count_is_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stages = "".join("  - {rate_scale: 1, duration_s: 1}\n" for _ in range(MAX_STAGES + 1))
    text = GOOD.replace("duration_s: 5\n", "stages:\n" + stages)
    line = plan_text(tmp_path, text, capsys)
    assert "spec.yaml: stages: expected at most 1,000 items (got [{'duration_s': 1, " in line
    assert len(line) < 400


def test_alias_bomb_spec_through_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = plan_text(tmp_path, BOMB, capsys)
    assert f"invalid YAML (the document expands to more than {MAX_NODES:,} nodes)" in line


@settings(HYPO, max_examples=30)
@given(
    value=hst.one_of(
        hst.floats(allow_nan=True, allow_infinity=True),
        hst.integers(min_value=-(2**70), max_value=2**70),
    ),
    field=hst.sampled_from(
        [
            "models[0].rate",
            "duration_s",
            "seed",
            "models[0].priority",
            "models[0].input_tokens.value",
            "models[0].output_tokens.max",
            "requests",
            "models[0].prefix.tokens",
        ]
    ),
)
def test_any_number_in_any_field_plans_sanely_or_fails_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: float, field: str
) -> None:
    # open-ended (`requests: 5` at 0.01 req/s): whatever value is set, the work stays small
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        GOOD.replace("duration_s: 5", "requests: 5")
        .replace("rate: 4", "rate: 0.01")
        .replace(
            "input_tokens: {type: fixed, value: 10}",
            "input_tokens: {type: fixed, value: 10}\n"
            "    prefix: {groups: 2, tokens: 4, share: 0.5}",
        )
        .replace(
            "output_tokens: {type: fixed, value: 5}",
            "output_tokens: {type: uniform, min: 1, max: 9}",
        )
    )
    raw = ".nan" if isinstance(value, float) and math.isnan(value) else repr(value)
    raw = {"inf": ".inf", "-inf": "-.inf"}.get(raw, raw)
    code, out, err = call(["plan", str(spec), "--json", "--set", f"{field}={raw}"], capsys)
    if code == 0:
        summary = json.loads(out)  # valid JSON: no NaN slipped into the output
        assert 1 <= summary["total"] <= (value if field == "requests" else 5)
        for side in ("input_tokens", "output_tokens"):
            assert 1 <= summary["models"]["m"][side]["max"] <= 10_000_000
    else:
        line = one_error_line(code, err)
        assert (
            f"spec.yaml: {field}" in line
            or "spec.yaml: the spec plans" in line
            or "spec.yaml: requests: " in line  # too slow a rate for 5 requests in 30 days
            or ("spec.yaml: models[0].output_tokens" in line)
        ), line


TREES = hst.recursive(
    hst.none()
    | hst.booleans()
    | hst.integers(-(2**66), 2**66)
    | hst.floats()
    | hst.text(alphabet="abcpoissonfixedtype_:-/.0 ", max_size=12),
    lambda kids: (
        hst.lists(kids, max_size=4)
        | hst.dictionaries(
            hst.sampled_from(["type", "value", "rate", "min", "max", "cv", "path", "x", "parts"]),
            kids,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@settings(HYPO, max_examples=20)
@given(
    key=hst.sampled_from(
        [
            "models[0].arrival",
            "models[0].input_tokens",
            "models[0]",
            "stages",
            "ramp",
            "slo",
            "name",
        ]
    ),
    tree=TREES,
)
def test_any_shape_in_any_field_plans_or_fails_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, tree: object
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(GOOD)
    value = json.dumps(tree).replace("NaN", ".nan").replace("Infinity", ".inf")
    code, out, err = call(["plan", str(spec), "--json", "--set", f"{key}={value}"], capsys)
    if code == 0:
        assert json.loads(out)["total"] >= 1
    else:
        assert f"{spec}: " in one_error_line(code, err)


# ---------------------------------------------------------------- ramps down to 0
@settings(max_examples=60, deadline=None)
@given(
    start=hst.floats(min_value=0, max_value=1e6, allow_nan=False),
    end=hst.floats(min_value=0, max_value=1e6, allow_nan=False),
    steps=hst.integers(2, MAX_STAGES),
)
def test_ramp_steps_hit_both_ends_exactly(start: float, end: float, steps: int) -> None:
    scales = [ramp_scale(start, end, k, steps) for k in range(steps)]
    assert scales[0] == start and scales[-1] == end
    assert all(s >= 0 for s in scales)


def test_ramp_down_to_zero_plans(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(GOOD.replace("duration_s: 5\n", ""))
    code, out, err = call(
        [
            "plan",
            str(spec),
            "--json",
            "--set",
            "ramp={start: 0.7, end: 0, duration_s: 18, steps: 10}",
        ],
        capsys,
    )
    assert code == 0, err
    stages = json.loads(out)["stages"]
    assert stages[-1]["rate_scale"] == 0.0 and stages[-1]["count"] == 0
    assert [round(s["rate_scale"], 12) for s in stages[:3]] == [
        0.7,
        round(0.7 * 8 / 9, 12),
        round(0.7 * 7 / 9, 12),
    ]


# ---------------------------------------------------------------- names and paths
@pytest.mark.parametrize(
    ("name", "slug"),
    [
        ("../../x", "x"),
        ("/etc/passwd", "etc-passwd"),
        ("chat 8b/v2", "chat-8b-v2"),
        ("a\x00b", "a-b"),
        ("...", "run"),
        ("", "run"),
        ("seed-two-models", "seed-two-models"),
        ("é" * 10 + "z", "z"),
        ("x" * 300, "x" * 64),
    ],
)
def test_slugify(name: str, slug: str) -> None:
    assert slugify(name) == slug


def test_a_name_cannot_leave_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "in" / "spec.yaml"
    spec.parent.mkdir()
    spec.write_text(GOOD.replace("name: fuzz", "name: ../../escaped"))
    out_dir = tmp_path / "runs" / "deep"
    code, _, err = call(["run", str(spec), "--target", "sim", "--out", str(out_dir)], capsys)
    assert code == 0, err
    runs = list(out_dir.iterdir())
    assert len(runs) == 1 and runs[0].name.startswith("escaped-")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "runs"]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["deep"]


def test_a_plan_of_no_requests_is_refused_before_a_run_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(GOOD.replace("duration_s: 5", "duration_s: 0.000001"))
    out_dir = tmp_path / "runs"
    code, out, err = call(["run", str(spec), "--target", "sim", "--out", str(out_dir)], capsys)
    line = one_error_line(code, err)
    assert line.startswith(f"phaselens: error: {spec}: the spec plans no requests")
    assert out == "" and not out_dir.exists()


# ---------------------------------------------------------------- a real process
@pytest.mark.parametrize("case", ["bomb", "binary", "jsonl-digits"])
def test_subprocess_exit_2_one_line(tmp_path: Path, case: str) -> None:
    spec = tmp_path / "spec.yaml"
    if case == "bomb":
        spec.write_text(BOMB)
    elif case == "binary":
        spec.write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00")
    else:
        (tmp_path / "t.jsonl").write_text('{"timestamp": 0, "input_length": ' + "1" * 5000 + "}\n")
        spec.write_text(TRACE_SPEC.format(path="t.jsonl", extra=""))
    r = subprocess.run(
        [sys.executable, "-m", "phaselens.cli", "plan", str(spec)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = one_error_line(r.returncode, r.stderr)
    assert r.stdout == "" and str(tmp_path) in line


def test_a_device_is_not_a_regular_file_and_is_never_read() -> None:
    # /dev/zero never ends: the reader must refuse it before reading, and say what it is
    from phaselens.inputs.yamlio import read_text

    with pytest.raises(InputError) as e:
        read_text("/dev/zero", "spec")
    assert str(e.value) == "/dev/zero: not a regular file; expected a spec file"
