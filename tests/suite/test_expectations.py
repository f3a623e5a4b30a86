"""conformance.expectations: --canary-expect files and CANARY_CAPABILITIES, run in a real pytest."""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
import types
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings
from hypothesis.errors import InvalidArgument

import strategies as st_kv
from conformance.expectations import ExpectationsError, load, parse
from tests import forked

SAMPLE = """
def test_fails():
    assert 1 + 1 == 3

def test_passes():
    assert 1 + 1 == 2

def test_raises_value_error():
    raise ValueError("boom")
"""


def run_suite(tmp_path, expectations: str | None, *args: str, sample: str = SAMPLE):
    """Run pytest with the suite's plugin on a sample file; returns (exit code, output)."""
    (tmp_path / "test_sample.py").write_text(textwrap.dedent(sample))
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rfxX"]
    command += ["-p", "conformance.plugin"]  # the sample lies outside conformance/
    # canary unless the call names its own implementation (an option given twice is refused)
    impl = [] if "--canary-impl" in args else ["--canary-impl", "canary"]
    command += [*impl, "--canary-device", "cpu", "test_sample.py", *args]
    if expectations is not None:
        (tmp_path / "expect.txt").write_text(textwrap.dedent(expectations))
        command += ["--canary-expect", "expect.txt"]
    done = forked.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


def test_listed_failure_is_an_xfail_with_its_reason(tmp_path):
    """A listed test that fails is reported as xfail with the listed reason; the run passes."""
    code, out = run_suite(
        tmp_path,
        """
        # a comment
        test_sample.py::test_fails  # [9] one plus one is not three here
        test_sample.py::test_raises_value_error -> ValueError  # [9] raises as expected
        """,
    )
    assert code == 0, out
    assert "XFAIL test_sample.py::test_fails - [9] one plus one is not three here" in out
    assert "1 passed, 2 xfailed" in out


def test_listed_pass_fails_the_run(tmp_path):
    """A listed test that passes fails the run (strict)."""
    code, out = run_suite(
        tmp_path,
        """
        test_sample.py::test_fails  # [9] fails
        test_sample.py::test_passes  # [9] listed, but passes
        test_sample.py::test_raises_value_error  # [9] fails
        """,
    )
    assert code == 1, out
    assert "[XPASS(strict)] [9] listed, but passes" in out


def test_unlisted_failure_fails_the_run(tmp_path):
    """A failure that the file does not list fails the run."""
    code, out = run_suite(tmp_path, "test_sample.py::test_raises_value_error  # [9] fails\n")
    assert code == 1, out
    assert "FAILED test_sample.py::test_fails" in out


def test_an_empty_file_fails_every_failure(tmp_path):
    """With no entries, every failing test fails the run as without a file."""
    code, out = run_suite(tmp_path, "# nothing expected\n")
    assert code == 1, out
    assert "2 failed, 1 passed" in out


def test_failing_another_way_than_listed_fails_the_run(tmp_path):
    """An entry narrowed to one exception type does not cover a failure of another type."""
    code, out = run_suite(
        tmp_path,
        """
        test_sample.py::test_fails -> ValueError  # [9] expected a ValueError
        test_sample.py::test_raises_value_error -> ValueError  # [9] fails
        """,
    )
    assert code == 1, out
    assert "FAILED test_sample.py::test_fails" in out


def test_globs_and_unmatched_entries(tmp_path):
    """``*`` matches any run of characters, ``[`` is literal; unmatched entries are printed."""
    code, out = run_suite(
        tmp_path,
        """
        test_sample.py::test_*fail*  # [9] glob
        test_sample.py::test_raises_*  # [9] glob
        test_sample.py::test_gone[x]  # [9] no such test
        """,
        "--hypothesis-profile",
        "dev",  # not a strict run: an entry that matches nothing is a warning
    )
    assert code == 0, out
    assert "expect.txt:4: test_sample.py::test_gone[x]" in out


def test_declared_capability_limits_the_drawn_layouts(tmp_path):
    """An implementation declaring source_ndim_max=2 gets 2-D layouts only, drawn and fitted:
    the suite hands the cap to the strategies (``conformance.profiles``)."""
    (tmp_path / "two_d_impl.py").write_text(
        "from canary import *  # noqa\nfrom canary import fingerprint, RealKvSource\n"
        "CANARY_CAPABILITIES = {'source_ndim_max': 2}\n"
    )
    sample = """
    import dataclasses
    from hypothesis import given, settings
    import strategies as st_kv
    from conformance import profiles

    @settings(max_examples=200, database=None)
    @given(st_kv.source_layouts(**profiles.layout_sizes()))
    def test_two_d(layout):
        assert len(layout.shape) == 2

    def test_fitted():
        layout = st_kv.SourceLayout(dtype="bfloat16", rows=2, row_shape=(2, 64), page_size=4,
            num_bytes_per_token=64, read_bytes=32, row_stride_bytes=256, offset_bytes=0,
            tail_bytes=0, fill="dense", seed=1)
        fitted = st_kv.fit_source_ndim(layout, profiles.SOURCE_NDIM_MAX)
        assert fitted.shape == (2, 128)
        assert dataclasses.replace(fitted, row_shape=(2, 64)) == layout
    """
    code, out = run_suite(tmp_path, None, "--canary-impl", "two_d_impl", sample=sample)
    assert code == 0, out
    assert "2 passed" in out
    code, out = run_suite(tmp_path, None, sample=sample)  # canary declares nothing: N-D drawn
    assert code == 1, out
    assert "FAILED test_sample.py::test_two_d" in out


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("test_x.py::test_a\n", "needs a reason"),
        ("test_x.py::test_a #\n", "needs a reason"),
        ("test_x.py  # a whole module\n", "would hide a whole module"),
        ("test_x.py::*  # every test of it\n", "would hide a whole module"),
        ("test_*.py::test_a  # many modules\n", "would hide a whole module"),
        ("test_x.py::test_a -> NoSuchError  # why\n", "not a builtin exception type"),
    ],
)
def test_malformed_entries_are_refused(text, problem):
    """Entries without a reason, hiding a module, or naming an unknown exception are refused."""
    with pytest.raises(ExpectationsError, match=problem):
        parse(text)


def test_parse_reads_reason_and_exception():
    """An entry keeps its pattern, its reason and its exception type."""
    (entry,) = parse("a.py::test_b[x: y] -> IndexError  # [5] a reason # with a hash\n")
    assert (entry.pattern, entry.reason, entry.raises) == (
        "a.py::test_b[x: y]",
        "[5] a reason # with a hash",
        IndexError,
    )
    assert entry.regex.match("a.py::test_b[x: y]")
    assert not entry.regex.match("a.py::test_b[x: yz]")


@settings(max_examples=50, database=None)
@given(data=st.data())
def test_limit_applies_to_draws(data):
    """With max_ndim=2 every drawn layout and every valid part of an invalid case is 2-D."""
    layout = data.draw(st_kv.source_layouts(max_ndim=2))
    assert len(layout.shape) == 2
    case = data.draw(st_kv.invalid_source_cases(rule=10, max_ndim=2))
    assert case.obj.kind != "tensor" or len(case.obj.shape) == 2


def test_the_limit_is_an_argument_checked_like_the_others():
    """max_ndim is None or an int >= 2; fitting with None changes nothing."""
    with pytest.raises(InvalidArgument, match="max_ndim=1 must be an int in"):
        st_kv.source_layouts(max_ndim=1)
    with pytest.raises(InvalidArgument, match="max_ndim=True must be an int"):
        st_kv.multi_invalid_source_cases(max_ndim=True)
    layout = st_kv.layout(rows=2, row_shape=(2, 16))
    assert st_kv.fit_source_ndim(layout, None) is layout
    assert st_kv.fit_source_ndim(layout, 2).row_shape == (32,)


# --- the report of an expected failure, and the file's own problems --------------------------


def test_an_expected_failure_is_xfailed_in_the_table_and_the_json(tmp_path):
    """A listed failure is ``xfailed`` in the summary table and in the JSON report, with its
    listed reason and no traceback, and the JSON counts it."""
    expect = tmp_path / "expect.txt"
    expect.write_text(
        "conformance/test_spec_vectors.py::test_spec_fingerprint_vectors[*  # [1] big-endian words\n"
    )
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "conformance.plugin"]
    command += ["--pyargs", "conformance.test_spec_vectors", "--canary-device", "cpu"]
    command += ["--canary-impl", "strength.known_bad.hash_big_endian_words"]
    command += ["--canary-expect", str(expect), "--canary-report", str(report)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = forked.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^test_spec_fingerprint_vectors +xfailed +5 ", done.stdout, re.M), done.stdout
    assert "2 passed, 1 xfailed properties" in done.stdout
    document = json.loads(report.read_text())
    (prop,) = [p for p in document["properties"] if p["name"].endswith("vectors")]
    assert prop["outcome"] == "xfailed"
    assert {case["outcome"] for case in prop["cases"]} == {"xfailed"}
    assert {case.get("xfail_reason") for case in prop["cases"]} == {"[1] big-endian words"}
    assert "Traceback" not in json.dumps(prop) and "skip_reason" not in json.dumps(prop)
    assert document["summary"]["xfailed"] == 1 and document["summary"]["passed"] == 2
    assert document["tests"] == {"passed": 3, "xfailed": 5}


def test_a_skip_reason_is_given_once():
    """A skipped test's reason is its own text, without pytest's ``Skipped: `` in front."""
    from conformance.report import Recorder

    recorder = Recorder(types.SimpleNamespace(), None, dict)
    recorder.pytest_runtest_logreport(
        types.SimpleNamespace(
            nodeid="conformance/test_x.py::test_y",
            duration=0.0,
            user_properties=[],
            skipped=True,
            failed=False,
            passed=True,
            when="setup",
            longrepr=("conformance/test_x.py", 3, "Skipped: no GPU here"),
        )
    )
    assert recorder.items["conformance/test_x.py::test_y"]["skip_reason"] == "no GPU here"


def test_an_expectations_file_with_a_byte_order_mark_is_refused(tmp_path):
    """A UTF-8 byte-order mark would hide the first entry: the file is refused, by name."""
    path = tmp_path / "expect.txt"
    path.write_bytes(b"\xef\xbb\xbftest_x.py::test_a  # [1] first\n")
    with pytest.raises(pytest.UsageError, match="byte-order mark"):
        load(str(path))


def test_a_non_utf8_expectations_file_is_a_usage_error(tmp_path):
    """An expectations file that is not UTF-8 is a usage error naming it, not a traceback."""
    path = tmp_path / "expect.txt"
    path.write_bytes("test_x.py::test_a  # [1] caf\xe9\n".encode("latin-1"))
    with pytest.raises(pytest.UsageError, match="not UTF-8"):
        load(str(path))


def test_a_duplicate_entry_is_named():
    """The same test listed twice is named with both lines, not reported as matching nothing."""
    with pytest.raises(ExpectationsError, match=r"<expectations>:3: .* also on line 1"):
        parse("test_x.py::test_a  # [1] one\n\ntest_x.py::test_a  # [1] again\n")


# --- an entry to remove: an expected failure that passes, an entry that matches no test ------


def test_an_expected_failure_that_passes_names_its_entry_and_file(tmp_path):
    """A listed test that passes says which entry of which file to remove."""
    code, out = run_suite(
        tmp_path,
        """
        test_sample.py::test_fails  # [9] fails
        test_sample.py::test_passes  # [9] listed, but passes
        """,
    )
    assert code == 1, out
    assert (
        "expected to fail, but passed: remove its entry from expect.txt\n"
        "  expect.txt:3: test_sample.py::test_passes\n"
    ) in out
    assert "[XPASS(strict)] [9] listed, but passes" in out


def test_the_announcement_of_an_expected_failure_that_passes_gives_the_entry(tmp_path):
    """The paragraph announcing a suite test that passed against its entry says why it fails
    the run and what to do, and the causes name the entry once for the tests it lists."""
    (tmp_path / "expect.txt").write_text(
        "conformance/test_spec_vectors.py::test_enums_are_the_contracts[*  # [1] passes now\n"
    )
    done = forked.run(
        [sys.executable, "-m", "conformance", "conformance.test_spec_vectors", "--canary-impl",
         "canary", "--canary-device", "cpu", "--canary-expect", "expect.txt", "-p",
         "no:cacheprovider"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    paragraph = done.stdout.split("kv-canary: FAILED conformance/test_spec_vectors.py::", 1)[1]
    assert (
        "\n    expected to fail, but passed: remove its entry from expect.txt\n"
        "      expect.txt:1: conformance/test_spec_vectors.py::test_enums_are_the_contracts[*\n"
        "      (it lists 2 tests: narrow it if the others still fail)\n"
    ) in paragraph.split("rerun alone:", 1)[0], paragraph[:1500]
    assert re.search(
        r"^2 tests: expected to fail, but passed: remove its entry from expect.txt$",
        done.stdout,
        re.M,
    ), done.stdout[-3000:]


STALE = """
test_sample.py::test_fails  # [9] fails
test_sample.py::test_raises_value_error  # [9] fails
test_sample.py::test_gone  # [9] renamed since
"""


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--hypothesis-profile", "ci"], 1),
        (["--hypothesis-profile", "dev"], 0),
        (["--hypothesis-profile", "ci", "-n", "2"], 1),
    ],
    ids=["ci: an error", "dev: a warning", "ci, on pytest-xdist workers"],
)
def test_an_entry_that_matches_no_test_is_an_error_in_a_ci_run(tmp_path, args, code):
    """A stale entry (it would hide the test that takes its name tomorrow) fails a ci run,
    which CI and the SGLang legs make, and is a warning in any other; either way it is named."""
    got, out = run_suite(tmp_path, STALE, *args)
    assert got == code, out
    assert "expect.txt:4: test_sample.py::test_gone" in out
    if code:
        assert "verdict: FAILED: 1 entry of expect.txt matches no test (a ci run refuses " in out
    else:
        assert "a warning here; a ci run fails on it" in out


def test_an_entry_of_a_test_this_run_leaves_out_is_not_stale(tmp_path):
    """An entry whose test ``-k`` deselected, or whose module the run did not collect, is no
    stale entry, also in a ci run."""
    code, out = run_suite(
        tmp_path,
        """
        test_sample.py::test_fails  # [9] fails
        test_other.py::test_elsewhere  # [9] a module this run does not collect
        """,
        "-k",
        "passes",
        "--hypothesis-profile",
        "ci",
    )
    assert code == 0, out
    assert "matching no test" not in out, out
