"""The upstream legs (conformance/upstream.py): every release has its tox leg and its
expectations file, releases share a file only where their kv_canary files are identical,
docs/UPSTREAM.md is up to date, the repro scripts reproduce on the installed release what its
expectations file says, and the core level leaves SGLang only its real divergences."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conformance import expectations, upstream, upstream_table
from tests import forked
from tests.tools.test_gpu_types import tox_envs

ROOT = Path(__file__).resolve().parents[2]
REPROS = ROOT / "docs" / "upstream"


def tags_of(stem: str) -> set[int]:
    path = upstream.EXPECTATIONS / f"{stem}.txt"
    return {tag for e in expectations.parse(path.read_text()) for tag in upstream_table._tags(e)}


def test_every_release_has_a_leg_and_a_file():
    """One tox leg sglang-RELEASE per release, labelled upstream, and each release's file exists."""
    legs = {name: labels for name, labels in tox_envs().items() if name.startswith("sglang")}
    assert set(legs) == {f"sglang-{r.version}" for r in upstream.RELEASES} | {
        f"sglang-kernels-{v}" for v in upstream.KERNEL_PATH_RELEASES
    }
    assert all("upstream" in labels for labels in legs.values())
    for entry in upstream.RELEASES:
        for path in ("dispatch", "kernels"):
            assert upstream.expectations_file(entry.version, path).is_file(), (entry, path)
    files = {p.stem for p in upstream.EXPECTATIONS.glob("sglang-*.txt")}
    kernels = {f"{upstream.release(v).expectations}-kernels" for v in upstream.KERNEL_PATH_RELEASES}
    assert files == {r.expectations for r in upstream.RELEASES} | kernels, "a file no leg uses"


def _entries(text: str, *, plan_group: bool) -> list[str]:
    """The entry lines of an expectations file before its plan group, or from it on."""
    at = text.index("# The plan group")
    part = text[at:] if plan_group else text[:at]
    return [line for line in part.splitlines() if not line.startswith("#")]


def test_the_kernel_path_files_differ_from_their_releases_only_in_the_plan_group():
    """A -kernels file holds its release's entries but those of the plan group, which are the
    kernel path's (sglang-0.5.20's, the last release whose CPU path it is)."""
    last = (upstream.EXPECTATIONS / "sglang-0.5.20.txt").read_text()
    for version in upstream.KERNEL_PATH_RELEASES:
        mine = upstream.expectations_file(version, "kernels").read_text()
        theirs = upstream.expectations_file(version, "dispatch").read_text()
        assert _entries(mine, plan_group=False) == _entries(theirs, plan_group=False), version
        assert _entries(mine, plan_group=True) == _entries(last, plan_group=True), version


def test_releases_share_a_file_only_where_their_files_are_identical():
    """Two releases share an expectations file iff their kv_canary content hashes are equal."""
    by_file: dict[str, set[str]] = {}
    by_hash: dict[str, set[str]] = {}
    for entry in upstream.RELEASES:
        by_file.setdefault(entry.expectations, set()).add(entry.kv_canary)
        by_hash.setdefault(entry.kv_canary, set()).add(entry.expectations)
    assert all(len(hashes) == 1 for hashes in by_file.values()), by_file
    assert all(len(files) == 1 for files in by_hash.values()), by_hash


def test_the_installed_release_is_the_listed_one():
    """The installed SGLang's kv_canary files hash to what RELEASES lists for its version
    (each upstream leg runs the same check for its own release)."""
    entry = upstream.check_installed()
    assert upstream.content_hash(upstream.installed_kv_canary()) == entry.kv_canary


def test_the_content_hash_sees_a_changed_byte(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    before = upstream.content_hash(tmp_path)
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    assert upstream.content_hash(tmp_path) == before, "caches are not the package's files"
    (tmp_path / "sub" / "b.py").write_text("y = 3\n")
    assert upstream.content_hash(tmp_path) != before


def test_upstream_doc_is_up_to_date():
    """docs/UPSTREAM.md is what `python -m conformance.upstream table` writes."""
    assert upstream.UPSTREAM_DOC.read_text() == upstream_table.render(
        upstream.RELEASES, upstream.EXPECTATIONS
    ), "docs/UPSTREAM.md is out of date: python -m conformance.upstream table"


def test_every_real_divergence_has_a_repro_script():
    for tag, divergence in upstream_table.DIVERGENCES.items():
        if divergence.level == "core" and divergence.engine_sees:
            assert (REPROS / divergence.repro).is_file(), (tag, divergence.repro)
    scripts = {p.name for p in REPROS.glob("repro_*.py")}
    assert scripts == {d.repro for d in upstream_table.DIVERGENCES.values() if d.repro}


def shared_part(script: Path) -> str:
    """A repro script without its docstring and its own ``main``: the loader and helpers."""
    text = script.read_text()
    return text[text.index("import importlib\n") : text.index("def main():")]


def test_the_repro_scripts_share_one_loader():
    """Each script carries the same loader and helpers, so that it runs alone when filed
    upstream; this keeps the copies one text (edit one, copy it to the others)."""
    scripts = sorted(REPROS.glob("repro_*.py"))
    first = shared_part(scripts[0])
    assert "def load_kv_canary" in first and "def report" in first
    drifted = [s.name for s in scripts[1:] if shared_part(s) != first]
    assert not drifted, f"differ from {scripts[0].name}: {drifted}"


@pytest.mark.parametrize(
    "tag", [t for t, d in upstream_table.DIVERGENCES.items() if d.repro], ids=lambda t: f"[{t}]"
)
def test_repro_scripts_reproduce_where_they_say(tag, tmp_path):
    """Each repro script, run alone from an empty folder against the installed release, exits
    1 (reproduced) iff that release is in the range its divergence records, else 0; and a
    release whose expectations file lists the divergence is in that range."""
    entry = upstream.check_installed()
    divergence = upstream_table.DIVERGENCES[tag]
    script = REPROS / divergence.repro
    done = forked.run(  # the script imports nothing of this project
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True
    )
    expected = upstream.reproduces_on(tag, entry.version)
    assert done.returncode == (1 if expected else 0), (
        f"{script.name} on sglang {entry.version} (in {divergence.reproduces}: {expected}): "
        f"exit {done.returncode}\n{done.stdout}{done.stderr}"
    )
    assert ("REPRODUCED" in done.stdout) == expected, done.stdout
    if tag in tags_of(entry.expectations):
        assert expected, f"[{tag}] is listed for {entry.version} but its script says fixed"


def test_core_level_leaves_sglang_only_its_real_divergences():
    """Collected at --canary-level core, the newest release's file matches no test through a
    full-level entry ([5]) and every real-divergence entry still names a collected test."""
    newest = upstream.RELEASES[-1]
    path = upstream.EXPECTATIONS / f"{newest.expectations}.txt"
    done = forked.run(
        [sys.executable, "-m", "pytest", "conformance", "--collect-only", "-q"]
        + ["-p", "no:cacheprovider", "--canary-level", "core"]
        + ["--canary-impl", "conformance.adapters.sglang", "--canary-device", "cpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    collected = [line for line in done.stdout.splitlines() if "::" in line]
    assert collected, done.stdout
    for entry in expectations.parse(path.read_text()):
        levels = {upstream_table.DIVERGENCES[tag].level for tag in upstream_table._tags(entry)}
        matched = [n for n in collected if entry.regex.match(n)]
        if levels == {"full"}:
            assert not matched, f"a full-level entry matches core tests: {entry.pattern}"
        else:
            assert matched, f"a core entry matches no core test: {entry.pattern}"


@pytest.mark.parametrize(
    ("extra", "profile"),
    [
        ((), "ci"),
        (("--hypothesis-profile", "mutation"), "mutation"),
        (("--hypothesis-profile=dev",), None),
    ],  # fmt: skip
    ids=["by default", "named apart", "named with ="],
)
def test_the_run_draws_the_ci_profile_unless_another_is_named(extra, profile, monkeypatch):
    """``run`` runs the suite on the installed release under the ``ci`` profile, or under the
    one its arguments name (``.ci/run``: ``mutation``), never under both."""
    calls = []
    monkeypatch.setattr(upstream.subprocess, "call", lambda args: calls.append(args) or 0)
    monkeypatch.setenv("CANARY_MATRIX", "off")
    assert upstream.main(["run", *extra]) == 0
    suite = calls[0]
    named = [a for a in suite if a.startswith("--hypothesis-profile")]
    assert len(named) == 1
    if profile is not None:
        assert suite[suite.index("--hypothesis-profile") + 1] == profile
