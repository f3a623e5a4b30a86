"""The mutation-testing tools: a config for every module, a fork server that sees each
mutant, and the triage data with the check that holds it to a session (docs/STRENGTH.md)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORKSERVER = ROOT / "strength" / "forkserver.py"


def configs() -> dict[str, dict]:
    """Each session's one-line keys (the configs keep them on one line; tomllib needs 3.11)."""
    out = {}
    for path in sorted((ROOT / "strength" / "mutation").glob("*.toml")):
        text = path.read_text()
        out[path.stem] = {
            key: re.search(rf'^{key} = "(.*)"$', text, re.M).group(1)
            for key in ("module-path", "test-command")
        }
    return out


def test_every_module_has_a_session():
    """Each module with code of canary/, canary_torch/ (its ``__init__`` is the backend) and
    reference/, and the two library modules of tools/, is some session's module (the GPU-host
    scripts of tools/ run on a GPU alone)."""
    modules = {
        str(path.relative_to(ROOT))
        for package in ("canary", "canary_torch", "reference")
        for path in (ROOT / package).glob("*.py")
        if path.name != "__init__.py" or package == "canary_torch"
    } | {"tools/compile_check.py", "tools/gpu_types.py"}
    covered = {config["module-path"] for config in configs().values()}
    assert modules - covered == set()
    assert covered - modules == set(), "a session names a module that does not exist"


@pytest.mark.parametrize("name", sorted(configs()))
def test_each_session_runs_pytest_quietly_and_stops_at_the_first_failure(name):
    """run.sh rewrites `python -m pytest ` to the fork server; -x makes a kill cheap."""
    command = configs()[name]["test-command"]
    assert command.startswith("python -m pytest "), command
    assert re.search(r"(^| )-x( |$)", command), command
    for path in re.findall(r"(?:conformance|tests)/[\w/]+\.py", command):
        assert (ROOT / path).exists(), path


def test_the_fork_server_sees_each_mutant(tmp_path):
    """Two versions of one module, the same size and written within a second: each run of
    the client imports the one on disk and exits with pytest's status."""
    (tmp_path / "target.py").write_text("VALUE = 1\n")
    (tmp_path / "test_target.py").write_text(
        "import target\n\ndef test_value():\n    assert target.VALUE == 1\n"
    )
    with fork_server(tmp_path) as socket:

        def run() -> int:
            return run_forked(socket, tmp_path, "test_target.py").returncode

        assert run() == 0
        (tmp_path / "target.py").write_text("VALUE = 2\n")  # a mutant of the same size
        assert run() == 1
        (tmp_path / "target.py").write_text("VALUE = 1\n")
        assert run() == 0
        assert not list(tmp_path.glob("**/*.pyc")), "children must write no bytecode"


def test_a_forked_run_makes_its_temporary_files_in_the_client_s_tmpdir(tmp_path):
    """A mutant writes its rewritten kernels to a temporary folder that an atexit handler
    removes, and a fork ends with os._exit, which runs no handler: the run's files go to the
    TMPDIR of the client (the gate's folder of that run, removed with it), not the server's."""
    (tmp_path / "server-tmp").mkdir()
    (tmp_path / "run-tmp").mkdir()
    (tmp_path / "test_probe.py").write_text(
        "import tempfile\n\ndef test_probe():\n    tempfile.mkdtemp(prefix='probe-')\n"
    )
    with fork_server(tmp_path, TMPDIR=str(tmp_path / "server-tmp")) as socket:
        ran = run_forked(socket, tmp_path, "test_probe.py", TMPDIR=str(tmp_path / "run-tmp"))
    assert ran.returncode == 0, ran.stdout
    assert [p.name[:6] for p in (tmp_path / "run-tmp").iterdir()] == ["probe-"]
    assert not list((tmp_path / "server-tmp").iterdir())


@contextlib.contextmanager
def fork_server(folder: Path, **env: str):
    """A fork server started in ``folder`` with ``env`` added to its environment; yields its
    socket."""
    socket = folder / "server.sock"
    server = subprocess.Popen(
        [sys.executable, str(FORKSERVER), "serve", "--socket", str(socket)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=os.environ | env,
    )
    try:
        deadline = time.monotonic() + 120
        while not socket.exists():
            assert server.poll() is None, server.stdout.read().decode()
            assert time.monotonic() < deadline, "the fork server did not start"
            time.sleep(0.1)
        yield socket
    finally:
        server.terminate()
        server.wait(timeout=30)
        if os.path.exists(socket):
            os.unlink(socket)


def run_forked(socket: Path, folder: Path, test_file: str, **env: str):
    """The fork server's client running ``pytest -q test_file`` in ``folder``."""
    command = [sys.executable, str(FORKSERVER), "run", "--socket", str(socket), "--", "-q"]
    return subprocess.run(
        [*command, "-p", "no:cacheprovider", test_file],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ | env,
    )


def test_a_replay_can_add_tests_to_a_sessions_selection():
    """``replay_survivors.py --also`` puts the given tests before the session's own options."""
    replay_survivors = replay_tool()
    command = "python -m pytest conformance/test_golden.py -x -q"
    assert replay_survivors.with_tests(command, []) == command
    assert replay_survivors.with_tests(command, ["a.py", "b.py"]) == (
        "python -m pytest a.py b.py conformance/test_golden.py -x -q"
    )
    with pytest.raises(ValueError, match="not a pytest command"):
        replay_survivors.with_tests("pytest -x", ["a.py"])


def replay_tool():
    """``strength/mutation/replay_survivors.py``, imported as a module."""
    sys.path.insert(0, str(ROOT / "strength" / "mutation"))
    try:
        import replay_survivors
    finally:
        sys.path.remove(str(ROOT / "strength" / "mutation"))
    return replay_survivors


def fabricated_session(path: Path, module: str, mutants: list[tuple[str, int, str | None]]):
    """A session database with cosmic-ray 8.7's tables, holding ``mutants``: (operator,
    occurrence, outcome), the outcome None for a mutant still pending. Outcomes are stored as
    cosmic-ray stores them, by the enum's name (``SURVIVED``, ``KILLED``)."""
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE work_items (job_id VARCHAR NOT NULL PRIMARY KEY);
        CREATE TABLE mutation_specs (
            module_path VARCHAR, operator_name VARCHAR, operator_args JSON, occurrence INTEGER,
            start_pos_row INTEGER, start_pos_col INTEGER, end_pos_row INTEGER,
            end_pos_col INTEGER, definition_name VARCHAR, job_id VARCHAR NOT NULL PRIMARY KEY
        );
        CREATE TABLE work_results (
            worker_outcome VARCHAR(9), output TEXT, test_outcome VARCHAR(11), diff TEXT,
            job_id VARCHAR NOT NULL PRIMARY KEY
        );
        """
    )
    for row, (operator, occurrence, outcome) in enumerate(mutants):
        job = f"job{row}"
        db.execute("INSERT INTO work_items VALUES (?)", (job,))
        db.execute(
            "INSERT INTO mutation_specs VALUES (?, ?, '{}', ?, ?, 4, ?, 5, NULL, ?)",
            (module, operator, occurrence, 10 + row, 10 + row, job),
        )
        if outcome is not None:
            db.execute(
                "INSERT INTO work_results VALUES ('NORMAL', '', ?, '', ?)", (outcome.upper(), job)
            )
    db.commit()
    db.close()


SESSION_MUTANTS = [
    ("core/NumberReplacer", 0, "survived"),
    ("core/NumberReplacer", 1, "killed"),
    ("core/ReplaceComparisonOperator_Lt_LtE", 0, "survived"),
    ("core/AddNot", 0, None),
]


def triage_of(entries: list[tuple[str, int]], unmapped: int = 0) -> dict:
    return {
        "session": "fabricated",
        "module": "pkg/module.py",
        "module_sha256": None,
        "survivors": [
            {"operator": op, "occurrence": occ, "verdict": "equivalent", "reason": "a reason"}
            for op, occ in entries
        ],
        "unmapped": [
            {"count": unmapped, "verdict": "equivalent", "reason": "a reason", "why": "counted"}
        ]
        if unmapped
        else [],
    }


def run_check(tmp_path: Path, triage: dict, capsys) -> tuple[int, str]:
    session = tmp_path / "fabricated.sqlite"
    if not session.exists():
        fabricated_session(session, "pkg/module.py", SESSION_MUTANTS)
    path = tmp_path / "fabricated.json"
    path.write_text(json.dumps(triage))
    status = replay_tool().main(["--check", str(session), "--triage", str(path)])
    return status, capsys.readouterr().out


def test_the_triage_check_passes_when_every_survivor_has_one_entry(tmp_path, capsys):
    """Both survivors triaged; an entry may also name a killed mutant, and a pending one needs
    none."""
    triage = triage_of(
        [
            ("core/NumberReplacer", 0),
            ("core/NumberReplacer", 1),
            ("core/ReplaceComparisonOperator_Lt_LtE", 0),
        ],
        unmapped=2,
    )
    status, out = run_check(tmp_path, triage, capsys)
    assert status == 0, out
    assert out.splitlines() == [
        "fabricated: 4 mutants (1 pending), 2 survived; 3 triage entries; "
        "2 more counted by the triage but unmapped: the triage matches",
        "fabricated: note: the triage is not stamped with pkg/module.py as it is",
    ]


def test_a_passing_check_stamps_the_triage_with_its_module(tmp_path, monkeypatch, capsys):
    """--stamp records the module's SHA-256 in the triage file, keeping its layout; from then
    on the triage is current until the module changes, and a check of an unstamped or stale
    triage says so in a note without failing."""
    tool = replay_tool()
    module = tmp_path / "pkg" / "module.py"
    module.parent.mkdir()
    module.write_text("VALUE = 1\n")
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    triage = triage_of([("core/NumberReplacer", 0), ("core/ReplaceComparisonOperator_Lt_LtE", 0)])
    fabricated_session(tmp_path / "fabricated.sqlite", "pkg/module.py", SESSION_MUTANTS)
    path = tmp_path / "fabricated.json"
    path.write_text(json.dumps(triage, indent=1))
    session = str(tmp_path / "fabricated.sqlite")
    assert tool.main(["--check", session, "--triage", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "fabricated: note: the triage is not stamped with pkg/module.py as it is"
    )
    assert tool.main(["--check", "--stamp", session, "--triage", str(path)]) == 0
    digest = hashlib.sha256(b"VALUE = 1\n").hexdigest()
    assert capsys.readouterr().out.splitlines()[-1].endswith(f"pkg/module.py {digest}")
    stamped = json.loads(path.read_text())
    assert stamped == {**triage, "module_sha256": digest}
    assert path.read_text() == json.dumps({**triage, "module_sha256": digest}, indent=1)
    assert tool.is_current(stamped)
    module.write_text("VALUE = 2\n")
    assert not tool.is_current(stamped)
    assert tool.main(["--check", session, "--triage", str(path)]) == 0
    assert "note: the triage is not stamped" in capsys.readouterr().out


def test_a_failing_check_stamps_nothing(tmp_path, capsys):
    triage = triage_of([("core/NumberReplacer", 0)])
    session = tmp_path / "fabricated.sqlite"
    fabricated_session(session, "pkg/module.py", SESSION_MUTANTS)
    path = tmp_path / "fabricated.json"
    path.write_text(json.dumps(triage))
    assert replay_tool().main(["--check", "--stamp", str(session), "--triage", str(path)]) == 1
    assert json.loads(path.read_text())["module_sha256"] is None
    assert "stamped" not in capsys.readouterr().out


def test_the_triage_check_fails_on_a_survivor_without_an_entry(tmp_path, capsys):
    triage = triage_of([("core/NumberReplacer", 0)])
    status, out = run_check(tmp_path, triage, capsys)
    assert status == 1
    assert out.splitlines()[0] == (
        "missing: core/ReplaceComparisonOperator_Lt_LtE 0 (line 12) survived and has no "
        "triage entry"
    )
    assert out.splitlines()[-1].endswith("; 1 triage entry: 1 mismatch")


def test_the_triage_check_fails_on_an_entry_that_names_no_mutant(tmp_path, capsys):
    """A stale entry (the module changed, or the occurrence is wrong) and a doubled one."""
    triage = triage_of(
        [
            ("core/NumberReplacer", 0),
            ("core/ReplaceComparisonOperator_Lt_LtE", 0),
            ("core/ReplaceComparisonOperator_Lt_LtE", 0),
            ("core/NumberReplacer", 7),
        ]
    )
    status, out = run_check(tmp_path, triage, capsys)
    assert status == 1
    assert out.splitlines()[:-1] == [
        "stale: core/NumberReplacer 7 has a triage entry but is no mutant of the session",
        "duplicate: core/ReplaceComparisonOperator_Lt_LtE 0 has 2 triage entries",
    ]


def test_the_triage_check_fails_on_another_module(tmp_path, capsys):
    triage = triage_of([("core/NumberReplacer", 0), ("core/ReplaceComparisonOperator_Lt_LtE", 0)])
    triage["module"] = "pkg/other.py"
    status, out = run_check(tmp_path, triage, capsys)
    assert status == 1
    assert out.startswith("module: the session mutates ['pkg/module.py']")


def test_a_triage_entry_outside_the_vocabulary_is_refused(tmp_path):
    tool = replay_tool()
    triage = triage_of([("core/NumberReplacer", 0)])
    triage["survivors"][0]["verdict"] = "probably fine"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(triage))
    with pytest.raises(ValueError, match="unknown verdict 'probably fine'"):
        tool.load_triage(path)
    triage["survivors"][0].update(verdict="equivalent", line=12)
    path.write_text(json.dumps(triage))
    with pytest.raises(ValueError, match="fields must be operator, occurrence, verdict, reason"):
        tool.load_triage(path)
    del triage["survivors"][0]["line"]
    triage["module_sha256"] = "ABC"
    path.write_text(json.dumps(triage))
    with pytest.raises(ValueError, match="module_sha256 must be null or 64 lower-case hex"):
        tool.load_triage(path)
    del triage["module_sha256"]
    path.write_text(json.dumps(triage))
    with pytest.raises(ValueError, match="keys must be session, module, module_sha256, "):
        tool.load_triage(path)


TRIAGE_FILES = sorted((ROOT / "strength" / "mutation" / "survivors").glob("*.json"))


@pytest.mark.parametrize("path", TRIAGE_FILES, ids=[path.stem for path in TRIAGE_FILES])
def test_every_triage_file_parses_with_the_fixed_verdicts(path):
    """Each file is one session's: its config exists and mutates the module it names; every
    entry has the fixed fields and a verdict of the vocabulary, and names its mutant once."""
    triage = replay_tool().load_triage(path)
    assert triage["session"] == path.stem
    assert configs()[path.stem]["module-path"] == triage["module"]
    keys = [(entry["operator"], entry["occurrence"]) for entry in triage["survivors"]]
    assert len(keys) == len(set(keys)), "a mutant triaged twice"
    assert triage["survivors"] or triage["unmapped"]


def test_the_verdicts_are_the_documented_ones():
    """docs/STRENGTH.md lists every verdict of the vocabulary, and no other."""
    text = (ROOT / "docs" / "STRENGTH.md").read_text()
    table = text.split("\n| verdict | meaning |\n", 1)[1].split("\n\n", 1)[0]
    listed = re.findall(r"^\| `([a-z-]+)` \|", table, re.M)
    assert sorted(listed) == sorted(replay_tool().VERDICTS)


def test_a_re_key_follows_each_mutant_to_its_new_occurrence():
    """``rekey_triage.mapping``: a mutant keeps its change and its line when code moves, so the
    k-th old mutant of a change goes to the k-th new one; a mutant whose line changed, or one
    more old mutant of a change than the new module has, is left out (reported as lost)."""
    sys.path.insert(0, str(ROOT / "strength" / "mutation"))
    try:
        import rekey_triage
    finally:
        sys.path.remove(str(ROOT / "strength" / "mutation"))
    op = "core/NumberReplacer"
    x, y = (op, "{}", "1", "x = 1"), (op, "{}", "2", "y = 2")
    old = [(op, 0, x), (op, 1, x), (op, 2, y), (op, 3, (op, "{}", "3", "z = 3")), (op, 4, y)]
    new = [(op, 0, y), (op, 1, x), (op, 2, x), (op, 3, (op, "{}", "3", "z = a.z + 3"))]
    assert rekey_triage.mapping(old, new) == {(op, 0): 1, (op, 1): 2, (op, 2): 0}
