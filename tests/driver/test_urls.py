"""Target URLs are checked once, at parse time: one line naming what is wrong, exit 2, the
password masked, nothing written. And the redaction rule itself, case by case."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from phaselens import cli
from phaselens.driver.options import DriverOptions, check_targets
from phaselens.errors import InputError
from phaselens.inputs.redact import Secrets, basic_auth, redact_text, redact_url
from phaselens.inputs.urls import url_problem
from phaselens.telemetry.options import parse_spec

from .conftest import make_schedule


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://[zz]:80", "bad IPv6 literal '[zz]'"),
        ("http://[::1", "bad IPv6 literal '[::1' (no closing ']')"),
        ("http://[::1]x:80", "bad text 'x:80' after the IPv6 literal"),
        ("http://::1:8000", "bad host (an IPv6 address goes in brackets"),
        ("http://h:99999", "bad port '99999' (expected a number 1-65535)"),
        ("http://h:0", "bad port '0'"),
        ("http://h:abc", "bad port 'abc'"),
        ("http://h:", "bad port ''"),
        ("http://h:80:90", "bad port '80:90'"),
        ("http://user:pw@", "no host"),
        ("http://user@:8000/v1", "no host"),
        ("http://:8000", "no host"),
        ("http://", "no host"),
        ("ftp://h:21", "unsupported scheme 'ftp' (expected http or https)"),
        ("h:8000", "expected http(s)://HOST[:PORT][/path]"),
        ("http://999.1.1.1:80", "bad IPv4 address '999.1.1.1'"),
        ("http://bad..name:80", "bad host name 'bad..name'"),
        ("http://h:80/a b", "spaces, control or non-ASCII characters"),
        ("http://h:80/\r\nX-Injected: 1", "spaces, control or non-ASCII characters"),
        ("http://h:80/é", "spaces, control or non-ASCII characters"),
        ("http://h/" + "a" * 9000, "longer than 8192 characters"),
        ("http://u:12/x@h:1", "an '@' after the host (in a password, percent-encode"),
    ],
)
def test_bad_urls_refused_with_the_reason(url: str, why: str) -> None:
    assert (url_problem(url) or "").startswith(why)
    with pytest.raises(InputError) as e:
        check_targets(make_schedule([0.0]), {"*": url}, DriverOptions())
    assert str(e.value).startswith("--target: ") and why in str(e.value)
    assert "\n" not in str(e.value) and len(str(e.value)) < 400


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000",
        "http://[::1]:8000/v1",
        "http://[fe80::1%25eth0]:8000",
        "https://api.example.com/openai/v1?api-version=2024-01-01",
        "HTTP://Host-1.svc_a.local:1/v1/chat/completions",
        "http://user:p%40ss@h:65535",
        "http://localhost",
    ],
)
def test_good_urls_accepted(url: str) -> None:
    assert url_problem(url) is None
    check_targets(make_schedule([0.0]), {"*": url}, DriverOptions())


def test_password_masked_in_the_refusal() -> None:
    for url, shown in (
        ("http://u:hunter2@h:99999", "http://u:***@h:99999: bad port '99999'"),
        ("http://u:hunt/er2@h:1", "http://***@h:1: an '@' after the host"),  # an unencoded '/'
        ("ftp://u:hunt/er2@h", "ftp://***@h: unsupported scheme 'ftp'"),
    ):
        with pytest.raises(InputError) as e:
            check_targets(make_schedule([0.0]), {"*": url}, DriverOptions())
        assert str(e.value).startswith(f"--target: {shown}")
        assert "hunt" not in str(e.value)


def test_telemetry_urls_checked_the_same_way() -> None:
    with pytest.raises(
        InputError, match=r"^--telemetry: dcgm: http://u:\*\*\*@\[zz\]:9400/metrics: bad IPv6"
    ):
        parse_spec("dcgm=http://u:pw@[zz]:9400/metrics", [])
    with pytest.raises(InputError, match="bad port '70000'"):
        parse_spec("auto", ["http://h:70000"])
    with pytest.raises(InputError) as e:
        parse_spec("gpu,nvlink=http://u:hunter2@h:1?token=t0ken", [])
    assert "hunter2" not in str(e.value) and "t0ken" not in str(e.value)


def test_cli_one_line_exit_2_and_no_run_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(
        "name: u\nseed: 1\nduration_s: 1\nmodels:\n  - name: m\n    rate: 2\n"
        "    input_tokens: {type: fixed, value: 8}\n    output_tokens: {type: fixed, value: 2}\n"
    )
    out = tmp_path / "runs"
    for url in ("http://u:hunter2@[::1:8000", "http://h:123456", "http://u:hunter2@"):
        code = cli.invoke(["run", str(spec), "--target", url, "--out", str(out)])
        o, err = capsys.readouterr()
        assert code == 2, (url, o, err)
        assert err.count("\n") == 1 and err.startswith("phaselens: error: "), err
        assert "--target: " in err and "hunter2" not in err + o and "Traceback" not in err
    assert not out.exists() or not any(out.iterdir())


# ---------------------------------------------------------------- the redaction rule
@pytest.mark.parametrize(
    ("url", "safe"),
    [
        ("http://h:8000/v1", "http://h:8000/v1"),
        ("http://user:secret@h:8000/v1", "http://user:***@h:8000/v1"),
        ("http://tok3n@h", "http://***@h"),  # a lone user name is the credential
        ("http://a@b:c@h:1", "http://a@b:***@h:1"),
        ("https://h/v1?api_key=K&model=x&flag", "https://h/v1?api_key=***&model=***&***"),
        ("http://h/p#frag", "http://h/p#***"),
        ("http://u:p@[::1", "http://u:***@[::1"),  # never raises, even on a broken URL
        ("sim:deploy.yaml", "sim:deploy.yaml"),
    ],
)
def test_redact_url(url: str, safe: str) -> None:
    assert redact_url(url) == safe


def test_redact_text_masks_every_known_secret() -> None:
    s = Secrets.of(
        ["http://alice:p%40ss@h:1/v1?api_key=QK-1&n=2"],
        {"X-Token": "Bearer hv-123456", "X-Priority": "1", "X-Key": "ab"},
        "sk-999",
    )
    basic = basic_auth("http://alice:p%40ss@h")
    assert basic is not None
    text = (
        f"HTTP 401: got {basic} p@ss p%40ss QK-1 sk-999 hv-123456 ab "
        '{"k": "sk-999"} http://x:y@other/q?t=z n=2 priority 1'
    )
    assert s.text(text) == (
        "HTTP 401: got Basic *** *** *** *** *** *** *** "
        '{"k": "***"} http://x:***@other/q?t=*** n=2 priority 1'
    )
    # cut off in the middle of a secret (a truncated server message): the stump is masked
    assert s.text("echo: hv-12") == "echo: ***"
    assert redact_text("key=abcdef tail", ["abcdef"]) == "key=*** tail"


@given(st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=4))
def test_a_password_never_survives_redaction(password: str) -> None:
    from urllib.parse import quote

    url = f"http://user:{quote(password, safe='')}@h:1/v1"
    safe = redact_url(url)
    assert quote(password, safe="") not in safe.split("@", 1)[0]
    s = Secrets.of([url])
    assert password not in s.text(f"server said: {password} / {basic_auth(url)}")


def test_every_cli_error_line_masks_urls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a message the CLI builds from the raw value (not via check_url) is masked when printed
    code = cli.invoke(["run", str(tmp_path / "s.yaml"), "--target", "=http://u:hunter2@h:1?k=v9"])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and err.startswith("phaselens: error: ")
    assert "hunter2" not in err and "v9" not in err and "u:***@h:1?k=***" in err


def test_sample_labels_scrubbed_only_where_a_secret_is() -> None:
    from phaselens.inputs.redact import scrub_samples
    from phaselens.types import TelemetrySample

    a = TelemetrySample(1, "vllm", "x", 1.0, {"auth": "Bearer sk-999", "model": "m"})
    b = TelemetrySample(1, "vllm", "y", 2.0, {"model": "m"})
    got = scrub_samples([a, b], Secrets.of(api_key="sk-999"))
    assert got[0].labels == {"auth": "Bearer ***", "model": "m"} and got[1] is b
    assert scrub_samples([a], Secrets())[0] is a  # no secrets: nothing to do


def test_public_names_and_short_values_are_no_secrets() -> None:
    url = "http://h/v1?model=chat-model-8b&region=eu&session=s1"
    masked = Secrets.of([url])
    assert masked.text("chat-model-8b in eu, s1") == "*** in eu, ***"
    public = Secrets.of([url], {"X-Model": "chat-model-8b"}, public=["chat-model-8b"])
    # the model name stays readable in the manifest and messages; `session` is secret-named
    assert public.text("chat-model-8b in eu, s1") == "chat-model-8b in eu, ***"
    assert redact_url(url) == "http://h/v1?model=***&region=***&session=***"  # URLs: all
