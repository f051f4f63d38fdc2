"""The opt-in compiled build (`ATTRIB_MYPYC=1 pip install .`, setup.py) through the real interface: a wheel built by
pip, installed into a directory of its own, and run in subprocesses. Its listed modules are extension modules, the
agent says it runs compiled, and a GPU-rate replay gives the pure package's digests to the bit.

The wheel is built once per source hash under the benchmarks' cache directory (~30-60 s the first time). With no C
compiler the build raises and this test FAILS with the build's words: CI machines have gcc.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attrib_agent.agent.build_kind import COMPILED_MODULES, KIND_COMPILED, KIND_PURE, build_kind, compiled_sources
from benchmarks.replay_throughput import compiled_site, prune_compiled, run_with

ROOT = Path(__file__).resolve().parents[2]
DIGEST_ARGS = ["--input", "gpu-rate", "--full-events", "2000", "--digest"]


def _digests(out: str) -> dict[str, str]:
    found = dict(re.findall(r"^(timeline|results|decode) digest: (\w+)", out, re.M))
    assert set(found) == {"timeline", "results", "decode"}, out[-2000:]
    return found


def test_this_process_runs_the_build_under_test_and_the_list_names_real_modules() -> None:
    """Pure Python, or compiled where `make unit-compiled` says so (the suite run against the installed wheel):
    a suite meant for the compiled build that imported this checkout's package fails here."""
    assert build_kind() == {"pure": KIND_PURE, "compiled": KIND_COMPILED}[os.environ.get("ATTRIB_EXPECT_BUILD", "pure")]
    assert len(set(COMPILED_MODULES)) == len(COMPILED_MODULES)
    for path in compiled_sources():
        assert (ROOT / path).is_file(), path


def test_the_cache_keeps_only_the_newest_compiled_builds(tmp_path: Path) -> None:
    builds = []
    for i in range(5):
        d = tmp_path / f"compiled-{i:016x}"
        (d / "site").mkdir(parents=True)
        (d / "built").write_text("x\n")
        os.utime(d / "built", (1000 + i, 1000 + i))
        builds.append(d)
    other = tmp_path / "compiled-in-place"  # not a wheel build (no site/): not this builder's to drop
    (other / "attrib_agent").mkdir(parents=True)
    (other / "built").write_text("x\n")
    assert prune_compiled(tmp_path, keep=3) == builds[:2]
    assert sorted(d.name for d in tmp_path.iterdir()) == sorted([other.name, *(d.name for d in builds[2:])])


@pytest.fixture(scope="module")
def site() -> Path:
    return compiled_site(None)


def test_the_compiled_install_is_extension_modules_and_says_so(site: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(site)}
    probe = ("import importlib, json; from attrib_agent.agent.build_kind import COMPILED_MODULES, PACKAGE, build_kind;"
             "print(json.dumps([build_kind(), {m: importlib.import_module(f'{PACKAGE}.{m}').__file__ "
             "for m in COMPILED_MODULES}]))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                         check=True).stdout
    kind, files = json.loads(out)
    assert kind == KIND_COMPILED
    for name, path in files.items():
        assert path.startswith(str(site)) and path.endswith(".so"), (name, path)
    version = subprocess.run([sys.executable, "-m", "attrib_agent", "--version"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, check=True).stdout
    assert version.strip().endswith(f"({KIND_COMPILED})"), version
    pure = subprocess.run([sys.executable, "-m", "attrib_agent", "--version"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout
    assert pure.strip().endswith(f"({KIND_PURE})"), pure


def test_the_compiled_install_replays_to_the_pure_packages_digests(site: Path) -> None:
    compiled = run_with(site, DIGEST_ARGS, capture=True)
    assert compiled.returncode == 0, compiled.stderr[-2000:]
    assert f"build: {KIND_COMPILED}" in compiled.stdout
    pure = subprocess.run([sys.executable, "-m", "benchmarks.replay_throughput", *DIGEST_ARGS], cwd=ROOT,
                          capture_output=True, text=True)
    assert pure.returncode == 0, pure.stderr[-2000:]
    assert f"build: {KIND_PURE}" in pure.stdout
    assert _digests(compiled.stdout) == _digests(pure.stdout)
