"""The conformance report: a summary table in the terminal, and JSON with ``--canary-report PATH``.

Per property (test function) it records the outcome, the examples Hypothesis ran, the time
taken, the failing example if any, and the reason of every skip. Facts travel on
``report.user_properties`` so that they survive pytest-xdist's worker-to-controller hop.

A failing property is also announced the moment it fails, in one short paragraph (what
failed, when, the first lines of its message, how to rerun it alone), while the run goes
on; the full failure with its draws and reproducing snippet follows at the end as usual.

Where ``GITHUB_STEP_SUMMARY`` names a file (as in a GitHub Actions job), the summary table is
also appended to it as Markdown, under a heading that names the implementation and device.

Above the verdict the summary names what the run did not check: every group of skipped tests,
with its contract group and sections, its count and its reason. A run that checked nothing
(every selected test skipped, or no test body run: ``--setup-only``, ``--setup-plan``), or
that skipped a contract group the implementation lacks without ``--canary-allow-missing
GROUP``, is no pass: it ends with an exit status of its own (:data:`EXIT_STATUSES`); a test
that ran no body is ``not run`` in the table, never ``passed``. ``--collect-only`` exits 0,
with a verdict that says it only collected.

Before pytest's paragraph of every failure, a failing run names each distinct cause of its
failures once (``conformance.causes``), with the number of tests it explains and one line that
reruns one of them; every rerun line the run prints runs as printed, in the same shell, from
the folder the run started in (:func:`rerun_command`).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from . import causes

#: The outcomes pytest counts on its last line ("455 passed, 2 xfailed in 12.3s"), in its order.
TEST_OUTCOMES = ("failed", "passed", "skipped", "deselected", "xfailed", "xpassed", "error")
_EXAMPLES = re.compile(r"(\d+) passing, (\d+) failing, and (\d+) invalid")
_FAILURE_START = ("Falsifying", "Failing test case", "E   ", "E       ")


#: The run's exit statuses and what each means: pytest's 0 to 5, and the suite's own 6 and 7,
#: given where pytest would say 0 but the run did not check what it was asked to.
NO_TEST_RAN = 6
INCOMPLETE = 7
EXIT_STATUSES = (
    (0, "passed", "every selected test ran and passed (or failed as the expectations file says)"),
    (1, "failed", "a test failed or errored, an expected failure passed, or (in a ci run) an "
     "entry of the expectations file matches no test"),
    (2, "interrupted", "Ctrl-C; the counts are of the tests that ran before it"),
    (3, "internal error", "an error of pytest or of a plugin"),
    (4, "usage error", "a bad option, implementation, device, profile or path, or a "
     "dependency this Python lacks; nothing ran"),
    (5, "no tests collected", "the selection matched none, or deselected all"),
    (NO_TEST_RAN, "no test ran", "every selected test was skipped, or the run ran no test "
     "body (--setup-only, --setup-plan); --collect-only exits 0, saying it only collected"),
    (INCOMPLETE, "incomplete", "what ran passed, but a contract group was skipped because the "
     "implementation lacks it (--canary-allow-missing GROUP accepts that)"),
)  # fmt: skip

#: The CONTRACT sections each module of the suite checks (conformance/README.md's table).
MODULE_SECTIONS = {
    "test_spec_vectors.py": ("§1", "§2"),
    "test_source_validation.py": ("§3",),
    "test_golden.py": ("§2", "§4", "§5", "§6", "§7"),
    "test_launch_refusals.py": ("§6", "§8"),
    "test_argument_kinds.py": ("§11",),
    "test_buffers.py": ("§5", "§11"),
    "test_plan_refusals.py": ("§12", "§13"),
    "test_golden_plan.py": ("§12", "§13"),
    "test_fingerprint.py": ("§4",),
    "test_write_verify.py": ("§5", "§6", "§7"),
    "test_scatter.py": ("§13",),
    "test_plan.py": ("§12", "§14"),
    "test_engine.py": ("§15",),
    "test_golden_scale.py": ("§4", "§6", "§7"),
    "test_scale.py": ("§4", "§5", "§6", "§7"),
}


def section_key(section: str) -> int:
    return int(section.lstrip("§"))


@dataclass(frozen=True)
class SkipGroup:
    """What a skip reason the suite gives stands for: a contract group the implementation
    lacks (``group``: its marker), or tests the device cannot run; ``waived`` when the run
    may pass without them (``--canary-allow-missing``, or not a group at all)."""

    what: str
    group: str | None
    waived: bool
    sections: tuple[str, ...] = ()  # the group's; none: those of the skipped tests' modules


def cut(line: str, limit: int = 120) -> str:
    """``line`` cut to ``limit`` characters, with a mark where it was cut."""
    return line if len(line) <= limit else line[: limit - 5] + " [..]"


def count_examples(statistics: str | None) -> int | None:
    """Examples run (passing + failing, all phases) from Hypothesis' statistics text."""
    if not statistics:
        return None
    return sum(int(p) + int(f) for p, f, _ in _EXAMPLES.findall(statistics)) or None


def failing_example(text: str, limit: int = 60) -> str:
    """The part of a failure that tells the story: the error lines, draws and the reproduce blob."""
    keep = [
        line
        for line in text.splitlines()
        if line.startswith(("E ", "E\t")) or "reproduce_failure" in line or "Draw " in line
    ]
    return "\n".join((keep or text.splitlines())[:limit])


def headline(text: str, limit: int = 4) -> list[str]:
    """The first lines of a failure's message: its ``E`` lines if pytest shows a traceback,
    else the message up to the configuration, the snippet or Hypothesis' own notes."""
    lines = text.splitlines()
    if "ExceptionGroup: " in text:  # Hypothesis found several distinct failures
        heads, failed, errors = [], [], []
        for line in lines:
            bare = line.lstrip(" |+")
            if "ExceptionGroup: " in bare:
                heads.append(bare.split("ExceptionGroup: ", 1)[1])
            elif bare.startswith("Failed: "):  # the suite's own messages, one per failure
                failed.append("- " + bare.removeprefix("Failed: "))
            elif re.match(r"[A-Z]\w*(Error|Exception): ", bare):
                errors.append("- " + bare)
        if heads:
            return (heads[:1] + (failed or errors))[:limit]
    errors = [line[1:].strip() for line in lines if line.startswith(("E ", "E\t"))]
    if errors:
        return [line for line in errors if line][:limit]
    kept = []
    for line in lines:
        if line.startswith(("[", "Reproduce with:", "Falsifying", "Failing test case", "Draw ")):
            break
        if line.strip():
            kept.append(line.rstrip())
    return kept[:limit]


def outcome_counts(config: pytest.Config) -> dict[str, int]:
    """Tests per outcome so far, as pytest's last line counts them (``passed``, ``xfailed``,
    ``deselected``, ...; outcomes with no test left out)."""
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    stats = getattr(terminal, "stats", {})
    return {key: len(stats[key]) for key in TEST_OUTCOMES if stats.get(key)}


def first_line(doc: str | None) -> str:
    return (doc or "").strip().splitlines()[0] if (doc or "").strip() else ""


SUITE_DIR = Path(__file__).resolve().parent


def in_suite(item: pytest.Item) -> bool:
    """Whether ``item`` is one of the suite's tests (a module of this folder)."""
    return item.path.parent == SUITE_DIR


def suite_id(item: pytest.Item) -> str:
    """``conformance/test_x.py::...`` for a test of the suite, however pytest was pointed at it
    (run from an installed copy its node id is relative to another folder); other tests' node
    ids as they are."""
    if in_suite(item):
        return f"conformance/{item.path.name}::{item.nodeid.split('::', 1)[1]}"
    return item.nodeid


def check_writable(path: str, where: str) -> None:
    """That a report can be written at ``path``, checked before the run (a file is made and
    removed again if there was none): else a usage error naming ``where`` it came from."""
    target = Path(path)
    if target.is_dir():
        raise pytest.UsageError(f"{where}: is a directory; give the path of a file")
    if not target.parent.is_dir():
        raise pytest.UsageError(f"{where}: its folder {str(target.parent)!r} does not exist")
    existed = target.exists()
    try:
        with open(target, "a", encoding="utf-8"):
            pass
    except OSError as error:
        raise pytest.UsageError(
            f"{where}: cannot write there ({error.strerror or error})"
        ) from error
    if not existed:
        target.unlink(missing_ok=True)


def rerun_command(test_id: str, options: str = "") -> str:
    """The command that reruns the suite's test ``test_id`` (``conformance/test_x.py::...``)
    alone, from any folder: by module name, with the suite's plugin."""
    module, _, rest = test_id.partition("::")
    target = module.removesuffix(".py").replace("/", ".") + "::" + rest
    command = (
        f"{shlex.quote(sys.executable)} -m pytest -p conformance.plugin --pyargs "
        f"{shlex.quote(target)}"
    )
    return f"{command} {options}" if options else command


#: A property's outcome is that of its worst case, in this order.
OUTCOME_ORDER = ("failed", "error", "xpassed", "xfailed", "passed", "skipped", "not run")


class Recorder:
    """A pytest plugin object collecting one record per test item."""

    def __init__(
        self,
        config: pytest.Config,
        path: str | None,
        environment,
        rerun_options=lambda: "",
        skip_groups=dict,
    ) -> None:
        self.config = config
        self.path = path
        self.environment = environment  # called at the end: it may import torch
        # called when a failure is announced, e.g. "--canary-impl X --canary-device cpu"
        self.rerun_options = rerun_options
        # called at the end: {skip reason the suite gives: SkipGroup}
        self.skip_groups = skip_groups
        self.status: tuple[int, str] | None = None  # the run's verdict, once it is known
        self.items: dict[str, dict] = {}
        self.started = datetime.datetime.now(datetime.timezone.utc)
        self.clock = time.monotonic()
        self.collected = 0  # the tests this run selected (after -k, -m and the level)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        report.canary_id = suite_id(item)  # kept in this process only (not sent by xdist)
        if report.failed and call.excinfo is not None:  # the exception lives here only
            report.user_properties.append(("canary_cause", causes.cause_of(call.excinfo.value)))
        if report.when == "teardown":
            report.user_properties.append(
                ("canary_doc", first_line(getattr(item.function, "__doc__", "")))
            )
            report.user_properties.append(
                ("canary_examples", count_examples(getattr(item, "hypothesis_statistics", None)))
            )

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        name = getattr(report, "canary_id", report.nodeid)
        record = self.items.setdefault(
            name, {"id": name, "outcome": "not run", "duration_s": 0.0, "examples": None}
        )
        record["duration_s"] += report.duration
        for key, value in report.user_properties:
            if key == "canary_doc":
                record["property"] = value
            elif key == "canary_examples":
                record["examples"] = value
            elif key == "canary_cause" and report.failed:
                record["cause"] = value
        expected = getattr(report, "wasxfail", None)
        if expected is not None and report.skipped:  # a listed failure
            record["outcome"] = "xfailed"
            record["xfail_reason"] = expected
        elif expected is not None and report.passed and report.when == "call":
            record["outcome"] = "xpassed"
            record["xfail_reason"] = expected
        elif report.skipped:
            record["outcome"] = "skipped"
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            record["skip_reason"] = reason.removeprefix("Skipped: ")
        elif report.failed:
            record["outcome"] = "failed" if report.when == "call" else "error"
            record["failing_example"] = failing_example(report.longreprtext)
            if "cause" not in record:  # no exception: an expected failure that passed
                record["cause"] = causes.cause_of(None, report.longreprtext)
            self.announce(report)
        elif report.when == "call" and record["outcome"] == "not run":
            record["outcome"] = "passed"  # only a test body that ran can pass
        if report.when == "call":
            record["ran"] = True

    def announce(self, report: pytest.TestReport) -> None:
        """Print a one-paragraph summary of a failure now, before the run goes on."""
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        if (
            terminal is None
            or hasattr(self.config, "workerinput")
            or not getattr(report, "canary_id", report.nodeid).startswith("conformance/")
        ):
            return
        what = "FAILED" if report.when == "call" else f"ERROR in {report.when}"
        test_id = getattr(report, "canary_id", report.nodeid)
        rerun = rerun_command(test_id, self.rerun_options())
        if getattr(terminal, "_width_of_current_line", 1):  # after progress dots
            terminal.write_line("")
        terminal.write_line(
            f"kv-canary: {what} {test_id} "
            f"({time.monotonic() - self.clock:.0f} s into the run, {report.duration:.1f} s in it)",
            red=True,
            bold=True,
        )
        for line in headline(report.longreprtext):
            terminal.write_line(f"    {cut(line)}")
        terminal.write_line(f"    rerun alone: {rerun}")
        terminal.write_line(
            "    (the whole failure, with its draws and snippet, follows at the end)"
        )

    def grouped(self) -> list[dict]:
        """Records folded per test function (parametrizations together)."""
        groups: dict[str, dict] = {}
        order = {outcome: rank for rank, outcome in enumerate(OUTCOME_ORDER)}
        for record in self.items.values():
            name = record["id"].split("[", 1)[0]
            group = groups.setdefault(
                name,
                {
                    "name": name,
                    "property": record.get("property", ""),
                    "count": 0,
                    "outcomes": defaultdict(int),
                    "examples": 0,
                    "duration_s": 0.0,
                    "skip_reasons": set(),
                    "xfail_reasons": set(),
                },
            )
            group["count"] += 1
            group["outcomes"][record["outcome"]] += 1
            group["examples"] += record["examples"] or 0
            group["duration_s"] += record["duration_s"]
            if record.get("skip_reason"):
                group["skip_reasons"].add(record["skip_reason"])
            if record.get("xfail_reason"):
                group["xfail_reasons"].add(record["xfail_reason"])
        for group in groups.values():
            present = [o for o in order if group["outcomes"].get(o)]
            group["outcome"] = min(present, key=order.get) if present else "not run"
        return sorted(groups.values(), key=lambda g: g["name"])

    def totals_line(self, groups: list[dict]) -> str:
        """``55 passed properties at level full``: the outcomes of the properties, and the level."""
        totals: dict[str, int] = defaultdict(int)
        for g in groups:
            totals[g["outcome"]] += 1
        line = ", ".join(f"{n} {outcome}" for outcome, n in sorted(totals.items())) + " properties"
        level = getattr(getattr(self.config, "_canary_selection", None), "level", None)
        if level:
            left_out = len(getattr(self.config, "_canary_level_left_out", ()))
            line += f" at level {level}" + (
                f" ({left_out} tests of the contract's additions not run)" if left_out else ""
            )
        return line

    def not_run(self) -> list[dict]:
        """What the run did not check: the suite's skipped tests, one entry per reason, with
        what the reason stands for, its contract sections and the count; a group the run may
        not pass without first."""
        known = self.skip_groups()
        entries: dict[str, dict] = {}
        for record in self.items.values():
            if record["outcome"] != "skipped" or not record["id"].startswith("conformance/"):
                continue
            reason = record.get("skip_reason", "")
            group = known.get(reason, SkipGroup("tests skipped for their own reason", None, True))
            entry = entries.setdefault(
                reason,
                {"what": group.what, "group": group.group, "waived": group.waived,
                 "reason": reason, "tests": 0, "sections": set(), "modules": set()},
            )  # fmt: skip
            module = record["id"].split("::", 1)[0].rsplit("/", 1)[-1]
            entry["tests"] += 1
            entry["modules"].add(module)
            entry["sections"].update(group.sections or MODULE_SECTIONS.get(module, ()))
        out = []
        for entry in entries.values():
            entry["sections"] = sorted(entry["sections"], key=section_key)
            entry["modules"] = sorted(entry["modules"])
            out.append(entry)
        return sorted(out, key=lambda e: (e["waived"], e["what"], e["reason"]))

    def verdict(self, exitstatus: int) -> tuple[int, str]:
        """The run's exit status and its verdict in words: pytest's, unless pytest would say
        0 for a run that checked nothing, or that skipped a group it may not skip."""
        status = int(exitstatus)
        ours = [r for r in self.items.values() if r["id"].startswith("conformance/")]
        stale = getattr(self.config, "_canary_expect_verdict", None)  # conformance.expectations
        if status == 0 and stale:
            return 1, f"FAILED: {stale} (exit status 1)"
        if status == 0 and self.config.getoption("collectonly", default=False):
            return 0, f"COLLECTED ONLY: {self.collected} tests collected, none run (exit status 0)"
        if status == 0:
            ran = [r for r in ours if r.get("ran") and r["outcome"] != "skipped"]
            if ours and not ran and all(r["outcome"] == "skipped" for r in ours):
                return NO_TEST_RAN, (
                    f"NO TEST RAN: every one of the {len(ours)} selected tests was skipped "
                    f"(exit status {NO_TEST_RAN})"
                )
            if ours and not ran:
                return NO_TEST_RAN, (
                    f"NO TEST RAN: {self.mode_without_bodies()} runs no test body, so nothing "
                    f"was checked: none of the {len(ours)} selected tests ran "
                    f"(exit status {NO_TEST_RAN})"
                )
            missing = [e for e in self.not_run() if not e["waived"]]
            if missing:
                groups = " and ".join(e["what"] for e in missing)
                flags = " ".join(f"--canary-allow-missing {e['group']}" for e in missing)
                return INCOMPLETE, (
                    f"INCOMPLETE: {groups} not run, as the implementation lacks it; {flags} "
                    f"accepts that (exit status {INCOMPLETE})"
                )
        word = {code: word for code, word, _ in EXIT_STATUSES}.get(status, "exit")
        return status, f"{word.upper()} (exit status {status})"

    def failure_causes(self) -> list[causes.Cause]:
        """The distinct causes of the suite's failures and errors, most tests first."""
        return causes.group(
            (record["id"], record["cause"])
            for record in self.items.values()
            if record["outcome"] in ("failed", "error") and record["id"].startswith("conformance/")
        )

    def rerun(self, test_id: str) -> str:
        return rerun_command(test_id, self.rerun_options())

    def write_causes(self, terminalreporter) -> None:
        """Each cause of the failures once, before pytest's paragraph of every failure."""
        found = self.failure_causes()
        if not found or hasattr(self.config, "workerinput"):
            return
        terminalreporter.section(causes.heading(found), red=True, bold=True)
        for line in causes.lines(found, self.rerun):
            terminalreporter.write_line(line)

    def mode_without_bodies(self) -> str:
        """The option that made this run skip the test bodies, in words."""
        for option, flag in (("setupplan", "--setup-plan"), ("setuponly", "--setup-only")):
            if self.config.getoption(option, default=False):
                return flag
        return "this run"

    def pytest_collection_finish(self, session) -> None:
        self.collected = len(session.items)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session, exitstatus) -> None:
        """The verdict, before the terminal's summary and the JSON report read it."""
        if hasattr(self.config, "workerinput"):
            return
        self.status = self.verdict(int(exitstatus))
        if self.status[0] != int(exitstatus):
            session.exitstatus = self.status[0]
        self.write_json(self.status[0])

    def not_run_lines(self, not_run: list[dict]) -> list[str]:
        lines = []
        for entry in not_run:
            sections = ", ".join(entry["sections"]) or "no section"
            waived = (
                " (allowed: --canary-allow-missing)" if entry["group"] and entry["waived"] else ""
            )
            lines.append(
                f"  {entry['what']} (CONTRACT {sections}): {entry['tests']} tests{waived}: "
                f"{entry['reason']}"
            )
        return lines

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config) -> None:
        groups = [g for g in self.grouped() if g["name"].startswith("conformance/")]
        if not groups:
            status = self.status or self.verdict(int(exitstatus))
            if status[0] != int(exitstatus) or (
                self.config.getoption("collectonly", default=False) and self.collected
            ):  # a verdict of the suite's own, also on tests of another folder
                terminalreporter.write_line(f"verdict: {status[1]}", bold=True, red=status[0] != 0)
            elif int(exitstatus) == int(pytest.ExitCode.NO_TESTS_COLLECTED):
                deselected = len(terminalreporter.stats.get("deselected", ()))
                terminalreporter.write_line(
                    "verdict: NO TESTS COLLECTED (exit status 5): "
                    + (
                        f"the selection (-k, -m, the level) deselected all {deselected} tests"
                        if deselected
                        else "the selection named no test of the suite"
                    ),
                    bold=True,
                    red=True,
                )
            return
        write = terminalreporter.write_line
        terminalreporter.section("KV-canary conformance")
        width = max(len(g["name"].split("::")[-1]) for g in groups)
        write(f"{'property':<{width}}  {'outcome':<8} {'cases':>5} {'examples':>8} {'seconds':>8}")
        for g in groups:
            write(
                f"{g['name'].split('::')[-1]:<{width}}  {g['outcome']:<8} {g['count']:>5} "
                f"{g['examples'] or '-':>8} {g['duration_s']:>8.2f}"
            )
            for reason in sorted(g["skip_reasons"]):
                write(f"{'':<{width}}    skipped: {reason}")
            for reason in sorted(g["xfail_reasons"]):
                write(f"{'':<{width}}    expected to fail: {reason}")
        line = self.totals_line(groups)
        if int(exitstatus) == int(pytest.ExitCode.INTERRUPTED):
            line = f"interrupted: {line} ran before it (the others did not run)"
        not_run = self.not_run()
        if not_run:
            write("not checked by this run:")
            for text in self.not_run_lines(not_run):
                write(text)
        write(line)
        status = self.status or self.verdict(int(exitstatus))
        write(f"verdict: {status[1]}", bold=True, red=status[0] != 0, green=status[0] == 0)
        if self.path:
            write(f"report written to {self.path}")
        step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if step_summary and not hasattr(config, "workerinput"):
            with open(step_summary, "a", encoding="utf-8") as handle:
                handle.write(self.markdown(groups, line, status[0]))
            write(f"summary also written to GITHUB_STEP_SUMMARY ({step_summary})")

    def markdown(self, groups: list[dict], totals: str, exitstatus) -> str:
        """The summary table as GitHub-flavoured Markdown, for a job's step summary."""
        selection = getattr(self.config, "_canary_selection", None)
        title = "KV-canary conformance"
        if selection is not None:
            title += f": {selection.module_name} on {selection.device}"
        counts = ", ".join(f"{n} {key}" for key, n in outcome_counts(self.config).items())
        lines = [
            f"## {title}",
            "",
            f"**{totals}** ({counts or 'no tests'}; exit status {int(exitstatus)})",
            "",
        ]
        not_run = self.not_run()
        if not_run:
            lines += ["Not checked by this run:", ""]
            lines += [f"- {text.strip()}" for text in self.not_run_lines(not_run)]
            lines.append("")
        lines += [
            "| property | outcome | cases | examples | seconds |",
            "|---|---|---:|---:|---:|",
        ]
        for g in groups:
            name = g["name"].split("::")[-1]
            outcome = (
                g["outcome"]
                if g["outcome"] in ("passed", "skipped", "xfailed")
                else f"**{g['outcome']}**"
            )
            lines.append(
                f"| `{name}` | {outcome} | {g['count']} | {g['examples'] or '-'} | "
                f"{g['duration_s']:.2f} |"
            )
        return "\n".join(lines) + "\n\n"

    def write_json(self, exitstatus: int) -> None:
        if not self.path:
            return
        properties = []
        for g in self.grouped():
            if not g["name"].startswith("conformance/"):
                continue
            cases = [r for r in self.items.values() if r["id"].split("[", 1)[0] == g["name"]]
            properties.append(
                {
                    "name": g["name"],
                    "property": g["property"],
                    "outcome": g["outcome"],
                    "examples": g["examples"],
                    "duration_s": round(g["duration_s"], 4),
                    **({"xfail_reasons": sorted(g["xfail_reasons"])} if g["xfail_reasons"] else {}),
                    "cases": [
                        {k: (round(v, 4) if k == "duration_s" else v) for k, v in r.items()}
                        for r in cases
                    ],
                }
            )
        document = {
            "suite": "kv-canary conformance",
            "started": self.started.isoformat(),
            "exit_status": int(exitstatus),
            "verdict": (self.status or self.verdict(exitstatus))[1],
            "not_run": self.not_run(),
            "causes": [
                {
                    "cause": c.cause,
                    "tests": c.count,
                    "modules": c.modules,
                    "first": c.first,
                    "rerun": self.rerun(c.first),
                }
                for c in self.failure_causes()
            ],  # fmt: skip
            "environment": self.environment(),
            "summary": {
                outcome: sum(1 for p in properties if p["outcome"] == outcome)
                for outcome in OUTCOME_ORDER
            },
            # tests (not properties) per outcome, as pytest's last line counts them
            "tests": outcome_counts(self.config),
            "properties": properties,
        }
        with open(self.path, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=2, sort_keys=True, default=str)
            handle.write("\n")
