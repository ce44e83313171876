"""The mypyc build of the simulator: same records as pure Python, and no stale compiled code.

Why: `setup.py` compiles the hot modules (`phaselens.sim.native.NATIVE_MODULES`) when it can,
so the suite usually runs compiled; these tests keep the pure-Python fallback honest (the same
digests as `test_records_hash`) and check the guard that refuses compiled modules whose
sources were edited after the build.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import warnings
from pathlib import Path

import pytest
from tests.pure import run_pure

import phaselens.sim as sim
from phaselens.sim import native

ROOT = Path(__file__).resolve().parents[2]
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def test_mode_matches_the_imported_modules() -> None:
    if sim.MODE == "compiled":
        assert native.is_compiled()
    else:
        assert not native.is_compiled()
    if sim.MODE == "stale":
        pytest.skip("compiled simulator older than its sources: running pure Python; `make native`")
    if sim.MODE == "pure" and not os.environ.get(native.PURE_ENV):
        pytest.skip("simulator not compiled (pure Python, ~3x slower): `make native` builds it")


def _fake_build(folder: Path, digest: str | None) -> None:
    for name in native.NATIVE_MODULES:
        (folder / f"{name}.py").write_text(f"X = {name!r}\n")
    (folder / f"engine{SUFFIX}").write_bytes(b"")
    if digest is not None:
        (folder / native.DIGEST_FILE).write_text(digest + "\n")


@pytest.fixture
def meta_path(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """sys.meta_path as a copy the test may change."""
    paths = list(sys.meta_path)
    monkeypatch.setattr(sys, "meta_path", paths)
    monkeypatch.delenv(native.PURE_ENV, raising=False)
    return paths


def test_select_no_extensions_is_pure(tmp_path: Path, meta_path: list[object]) -> None:
    n = len(meta_path)
    assert native.select(tmp_path) == "pure"
    assert len(meta_path) == n


def test_select_matching_digest_is_compiled(tmp_path: Path, meta_path: list[object]) -> None:
    _fake_build(tmp_path, None)
    (tmp_path / native.DIGEST_FILE).write_text(native.source_digest(tmp_path) + "\n")
    n = len(meta_path)
    assert native.select(tmp_path) == "compiled"
    assert len(meta_path) == n


@pytest.mark.parametrize("digest", [None, "0" * 64])
def test_select_stale_build_runs_sources(
    tmp_path: Path, meta_path: list[object], digest: str | None
) -> None:
    _fake_build(tmp_path, digest)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (silent: stderr of commands stays clean)
        assert native.select(tmp_path) == "stale"
    finder = meta_path[0]
    assert isinstance(finder, native._Sources)
    spec = finder.find_spec("phaselens.sim.engine", None)
    assert spec is not None and spec.origin == str(tmp_path / "engine.py")
    assert finder.find_spec("phaselens.sim.run", None) is None
    assert finder.find_spec("other.engine", None) is None


def test_select_env_forces_pure(
    tmp_path: Path, meta_path: list[object], monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_build(tmp_path, None)
    (tmp_path / native.DIGEST_FILE).write_text(native.source_digest(tmp_path) + "\n")
    monkeypatch.setenv(native.PURE_ENV, "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.select(tmp_path) == "pure"
    assert isinstance(meta_path[0], native._Sources)


def test_digest_follows_every_source(tmp_path: Path) -> None:
    _fake_build(tmp_path, None)
    d0 = native.source_digest(tmp_path)
    (tmp_path / "stretch.py").write_text("X = 'edited'\n")
    assert native.source_digest(tmp_path) != d0


@pytest.mark.skipif(sim.MODE != "compiled", reason="pure Python here: test_records_hash is it")
def test_pure_python_fallback_same_records() -> None:
    """The compiled run is checked by test_records_hash; the same digests from pure Python."""
    code = (
        "import phaselens.sim as s\n"
        "from tests.sim.test_records_hash import EXPECTED, run_scenario\n"
        "assert s.MODE == 'pure', s.MODE\n"
        "bad = [k for k in sorted(EXPECTED) if run_scenario(k) != EXPECTED[k]]\n"
        "print('differ:', bad)\n"
    )
    out = run_pure(code, sim.__file__)
    assert out.strip().endswith("differ: []"), out


def test_frozen_dataclasses_pickle_and_copy() -> None:
    """Compiled frozen dataclasses unpickle through their constructor (Ray, multiprocessing)."""
    import copy
    import pickle

    from phaselens.sim.client import LoadShape
    from phaselens.sim.cluster import Cluster
    from phaselens.sim.cost import CostParams
    from phaselens.sim.deploy import default_deployment

    dep = default_deployment(["m"])
    cost = Cluster(dep).engines[0].cost
    for obj in (CostParams(), CostParams(eta_linear=0.5), LoadShape(concurrency=3), dep, cost):
        back = pickle.loads(pickle.dumps(obj))
        assert back == obj and type(back) is type(obj)
        assert copy.deepcopy(obj) == obj
    back = pickle.loads(pickle.dumps(cost))
    args = (4, 4, 4000.0, 4000.0, 4, cost.bandwidth)
    assert back.step_bw(*args) == cost.step_bw(*args)
