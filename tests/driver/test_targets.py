"""Target URLs, routing and redaction: the strings that end up on the wire and on disk."""

from __future__ import annotations

import pytest

from phaselens.cli.args import parse_pairs
from phaselens.driver.options import DriverOptions, check_targets, endpoint_url
from phaselens.errors import InputError
from phaselens.execute import HttpTarget, SimTarget, target_of
from phaselens.inputs.redact import redact_url

from .conftest import make_schedule


@pytest.mark.parametrize(
    ("base", "endpoint", "want"),
    [
        ("http://h:8000", "chat", "http://h:8000/v1/chat/completions"),
        ("http://h:8000/", "completions", "http://h:8000/v1/completions"),
        ("http://h:8000/v1", "chat", "http://h:8000/v1/chat/completions"),
        ("https://api.x.com/openai/v1/", "completions", "https://api.x.com/openai/v1/completions"),
        ("http://h/v1/chat/completions", "completions", "http://h/v1/chat/completions"),
        ("http://h:1/prefix", "chat", "http://h:1/prefix/v1/chat/completions"),
    ],
)
def test_endpoint_url(base: str, endpoint: str, want: str) -> None:
    assert endpoint_url(base, endpoint) == want  # type: ignore[arg-type]


def test_bad_urls_and_redaction() -> None:
    for bad, why in (
        ("ftp://h:1", "unsupported scheme 'ftp'"),
        ("h:8000", "expected http"),
        ("http://", "no host"),
    ):
        with pytest.raises(InputError, match=f"^--target: .*{why}"):
            endpoint_url(bad, "chat")
    assert redact_url("http://user:secret@h:8000/v1") == "http://user:***@h:8000/v1"
    assert redact_url("http://h:8000/v1") == "http://h:8000/v1"
    with pytest.raises(InputError) as e:
        endpoint_url("ftp://user:secret@h:1", "chat")
    assert "secret" not in str(e.value)


def test_cli_target_parsing() -> None:
    assert target_of(["http://a:1"]) == HttpTarget({"*": "http://a:1"})
    assert target_of(["m1=http://a:1", "m2=http://b:2/v1?x=y"]) == HttpTarget(
        {"m1": "http://a:1", "m2": "http://b:2/v1?x=y"}
    )
    assert target_of(["http://a:1/v1?x=y"]) == HttpTarget({"*": "http://a:1/v1?x=y"})
    assert target_of(["sim:deploy.yaml"]) == SimTarget("sim:deploy.yaml")
    with pytest.raises(InputError, match="one plain URL"):
        target_of(["http://a:1", "http://b:2"])
    with pytest.raises(InputError, match="sim cannot be mixed"):
        target_of(["m1=http://a:1", "m2=sim"])
    assert parse_pairs(["X-A: 1:2", "B:c"], "--header", ":") == {"X-A": "1:2", "B": "c"}
    with pytest.raises(InputError, match="expected KEY=VALUE"):
        parse_pairs(["novalue"], "--model-map", "=")


def test_routing_needs_a_target_per_model() -> None:
    s = make_schedule([0.0, 1.0], models=("a", "b"), model_idx=[0, 1])
    check_targets(s, {"a": "http://x:1", "b": "http://y:2"}, DriverOptions())
    check_targets(s, {"a": "http://x:1", "*": "http://y:2"}, DriverOptions())
    with pytest.raises(InputError, match="no target for model 'b'"):
        check_targets(s, {"a": "http://x:1"}, DriverOptions())


@pytest.mark.parametrize(
    ("targets", "options", "opt"),
    [
        ({"a": "http://x:1", "b": "http://y:2", "typo": "http://z:3"}, DriverOptions(), "--target"),
        ({"*": "http://x:1"}, DriverOptions(model_map={"typo": "served"}), "--model-map"),
    ],
)
def test_a_per_model_option_naming_no_model_is_refused(
    targets: dict[str, str], options: DriverOptions, opt: str
) -> None:
    # it would be silently unused: the user meant a model of the spec
    s = make_schedule([0.0, 1.0], models=["a", "b"], model_idx=[0, 1])
    with pytest.raises(InputError) as e:
        check_targets(s, targets, options)
    assert str(e.value) == f"{opt}: unknown model 'typo' (the schedule has a, b)"
