"""Fuzz option values, output paths and malformed command lines of every command (in-process).

These inputs are refused while the options are parsed, or lead to the small base run's work, so
they run in this process (fast); the cases that could cost memory or time are elsewhere.
"""

from __future__ import annotations

from pathlib import Path

from fuzzbase import Base
from fuzzlib import check_case, fuzz_settings, new_case
from hypothesis import given
from hypothesis import strategies as st
from mutations import OPTION_NUMBERS


def _numeric_options(b: Base) -> list[tuple[list[str], str]]:
    """(a command line with its required arguments, a numeric option it takes)."""
    run, sim = str(b.run), ["--target", "sim", "--out", "out", "--quiet"]
    return [
        (["run", str(b.spec), *sim], "--timeout"),
        (["run", str(b.spec), *sim], "--idle-timeout"),
        (["run", str(b.spec), *sim], "--telemetry-interval"),
        (["run", str(b.spec), *sim], "--workers"),
        (["run", str(b.spec), *sim], "--max-inflight"),
        (["run", str(b.spec), *sim], "--concurrency"),
        (["analyze", run, "--json"], "--gpu-cost-per-hour"),
        (["trace", run, "-o", "t.json", "--no-findings"], "--from"),
        (["trace", run, "-o", "t.json", "--no-findings"], "--to"),
        (["compare", run, run, "--json"], "--n-boot"),
        (["compare", run, run, "--json", "--n-boot", "100"], "--seed"),
        (["whatif", run, "--calib", str(b.calib), "--json"], "--max-runs"),
        (["whatif", run, "--calib", str(b.calib), "--json"], "--sample"),
        (["whatif", run, "--calib", str(b.calib), "--json"], "--jobs"),
        (["whatif", run, "--calib", str(b.calib), "--json"], "--seed"),
        (["whatif", run, "--calib", str(b.calib), "--json"], "--gpu-cost-per-hour"),
    ]


@given(data=st.data())
@fuzz_settings(30)
def test_numeric_option_values(base: Base, data: st.DataObject) -> None:
    args, opt = data.draw(st.sampled_from(_numeric_options(base)))
    value = data.draw(st.sampled_from([*OPTION_NUMBERS, "1", "0.5", "100"]))
    case = new_case(base.root)
    case.allowed_new |= {"out", "t.json"}
    full = [*args, opt, value] if not value.startswith("-") else [*args, f"{opt}={value}"]
    o = check_case(
        f"option/{args[0]}",
        case,
        full,
        root=base.root,
        reads=[base.run],
        inputs={"option": f"{opt}={value}"},
    )
    if value.strip().lower() in ("inf", "-inf", "nan", "1e309", "9" * 400, "abc", ""):
        assert o.code == 2 and opt in o.err, f"{opt}={value!r} accepted: {o.err!r}"


def _out_paths(b: Base) -> list[str]:
    return [
        ".",  # a directory
        "/",
        str(b.root / "cases"),
        str(b.spec) + "/x.out",  # a file where a directory is expected
        str(b.spec),  # an existing file (overwritten: allowed for -o files, not for --out dirs)
        "/proc/phaselens-fuzz/x",
        "/proc/self/status",
        "/sys/phaselens-fuzz",
        "/dev/full",
        "missing/parent/x.out",
        "",
        "x" * 300,
        "out/" + "y" * 300,
    ]


def _out_options(b: Base) -> list[tuple[list[str], str]]:
    run = str(b.run)
    return [
        (["plan", str(b.spec)], "--out"),
        (["run", str(b.spec), "--target", "sim", "--quiet"], "--out"),
        (["demo", "--spec", str(b.spec)], "--out"),
        (["report", run], "-o"),
        (["trace", run, "--no-findings"], "-o"),
        (["compare", run, run, "--n-boot", "100"], "-o"),
        (["calibrate", run, "--deploy", str(b.deploy)], "-o"),
        (["whatif", run, "--calib", str(b.calib)], "-o"),
    ]


@given(data=st.data())
@fuzz_settings(30)
def test_output_paths(base: Base, data: st.DataObject) -> None:
    args, opt = data.draw(st.sampled_from(_out_options(base)))
    path = data.draw(st.sampled_from(_out_paths(base)))
    if path == str(base.spec) and (opt == "-o" or args[0] == "plan"):
        path = "existing.out"  # overwriting a file the user names is fine; not the fixture's
    case = new_case(base.root)
    case.allowed_new |= {"missing", "out", "x" * 300, "existing.out", "compare.html"}
    case.allow_any = path in (".", "") and opt == "--out"  # Path("") is "."
    if path == "existing.out":
        case.path(path).write_text("old\n")
    o = check_case(
        f"output/{args[0]}",
        case,
        [*args, opt, path],
        root=base.root,
        reads=[base.run, base.spec],
        inputs={"output": path},
    )
    if path in (".", "/", str(base.root / "cases")) and opt != "--out":
        assert o.code == 2 and "directory" in o.err, o.err
    if path.startswith(("/proc/", "/sys/")) or path == str(base.spec) + "/x.out":
        assert o.code == 2, o.err


def _malformed(b: Base) -> list[list[str]]:
    run, spec = str(b.run), str(b.spec)
    return [
        [],
        ["--bogus"],
        ["nosuchcommand"],
        ["plan"],
        ["plan", spec, spec],
        ["plan", spec, "--bogus"],
        ["plan", spec, "--set"],
        ["plan", spec, "--set", "novalue"],
        ["plan", "/nonexistent/spec.yaml"],
        ["plan", str(b.root / "cases")],
        ["plan", "/dev/null"],
        ["plan", "/proc/self/mem"],
        ["run", spec],
        ["run", spec, "--target", ""],
        ["run", spec, "--target", "sim:"],
        ["run", spec, "--target", "sim:/nonexistent.yaml"],
        ["run", spec, "--target", f"sim:{b.root / 'cases'}"],
        ["run", spec, "--target", "sim", "--target", "sim"],
        ["run", spec, "--target", "http://[::1", "--quiet"],
        ["run", spec, "--target", "http://127.0.0.1:99999", "--quiet"],
        ["run", spec, "--target", "http://127.0.0.1:abc", "--quiet"],
        ["run", spec, "--target", "http://user@", "--quiet"],
        ["run", spec, "--target", "ftp://127.0.0.1:1", "--quiet"],
        ["run", spec, "--target", "=", "--quiet"],
        ["run", spec, "--target", "sim", "--endpoint", "nope"],
        ["run", spec, "--target", "sim", "--loop", "nope"],
        ["analyze"],
        ["analyze", "/nonexistent"],
        ["analyze", spec],
        ["analyze", str(b.root / "cases")],
        ["report", run, "-o"],
        ["trace", run, "--from", "5", "--to", "1"],
        ["compare", run],
        ["compare", run, "/nonexistent"],
        ["compare", run, run, "--fail-on", "nonsense"],
        ["compare", run, run, "--fail-on", "ttft_p99:+abc%"],
        ["calibrate", run],
        ["calibrate", run, "--deploy", "/nonexistent.yaml"],
        ["calibrate", run, "--deploy", str(b.deploy), "--from", "nope"],
        ["whatif", run],
        ["whatif", run, "--calib", "/nonexistent.yaml"],
        ["whatif", run, "--calib", str(b.calib), "--set", "nope=1"],
        ["whatif", run, "--calib", str(b.calib), "--set", "policy.max_num_seqs="],
        ["whatif", run, "--calib", str(b.calib), "--set", "policy.max_num_seqs=nan"],
        ["demo", "--target", "http://127.0.0.1:1"],
        ["demo", "--spec", "/nonexistent.yaml"],
    ]


def test_malformed_command_lines(base: Base) -> None:
    for args in _malformed(base):
        case = new_case(base.root)
        case.allowed_new |= {"runs", "compare.html", "calib.yaml", "whatif.html"}
        o = check_case(
            f"cmdline/{(args or ['-'])[0]}",
            case,
            args,
            root=base.root,
            reads=[base.run],
            inputs={"args": " ".join(args)},
        )
        assert o.code == (0 if not args else 2), f"{args}: exit {o.code}"


def test_help_and_version_still_work(base: Base) -> None:
    for args in (["--help"], ["--version"], ["run", "--help"], ["whatif", "--help"]):
        case = new_case(base.root)
        o = check_case("cmdline/help", case, args, root=base.root)
        assert o.code == 0 and o.out.strip(), args
    assert Path(base.run).is_dir()


# Only loopback hosts (or none): a generated URL must never reach the network.
SCHEMES = ["http://", "https://", "ftp://", "", "HTTP://", "http:/", "sim:"]
HOSTS = [
    "127.0.0.1",
    "[::1]",
    "[::1",
    "::1",
    "[::ffff:127.0.0.1]",
    "localhost",
    "",
    "user@",
    "user:pw@",
    "@127.0.0.1",
    "user:pw@127.0.0.1",
    "[fe80::1%25lo]",
    "127.0.0.1\x7f",
    "[]",
]
PORTS = ["", ":0", ":65536", ":99999", ":-1", ":abc", ":9", ":1"]
TAILS = ["", "/v1", "/?api_key=secret", "#frag", "/" + "p" * 300]
TELEMETRY = [
    "none",
    "auto",
    "gpu",
    "bogus",
    "dcgm=",
    "dcgm=ftp://127.0.0.1:9",
    ",,,",
    "engine=http://[::1",
    "gpu,gpu",
    "engine=http://127.0.0.1:9/metrics",
]
HEADERS = ["X-A: b", "X-A", ": v", "X-A:\nB", "Host: 127.0.0.1", "X-" + "a" * 300 + ": v"]


@given(
    url=st.tuples(*(st.sampled_from(x) for x in (SCHEMES, HOSTS, PORTS, TAILS))).map("".join),
    telemetry=st.sampled_from(TELEMETRY),
    header=st.sampled_from(HEADERS),
)
@fuzz_settings(5)
def test_run_http_targets(base: Base, url: str, telemetry: str, header: str) -> None:
    """Bad URLs, telemetry specs and headers refused in one line; a loopback port that refuses
    connections gives a finished run."""
    case = new_case(base.root, allowed=("out",))
    args = [
        "run",
        str(base.spec),
        "--target",
        url,
        "--telemetry",
        telemetry,
        "--header",
        header,
        "--set",
        "duration_s=1",
        "--out",
        "out",
        "--quiet",
        "--timeout",
        "5",
    ]
    check_case(
        "url/run",
        case,
        args,
        root=base.root,
        subprocess_=True,
        exit1_ok=True,
        inputs={"url": url, "telemetry": telemetry, "header": header},
    )
