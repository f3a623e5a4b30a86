"""The engine histories' coverage floors (``conformance/test_engine.py``): where the CPU's fixed
draws do not reach every counted situation ``SITUATION_FLOOR`` times by the rules' own draws,
the test fails and names the situations short of it (that they do reach them is the suite's own
run, in the gate and in the SGLang leg)."""

from __future__ import annotations

from tests.suite import runs

#: A plugin that sets the histories' share of the examples back to the one the fixed first steps
#: had (0.2): without them, the rules alone leave several situations under the floor.
HALF_THE_HISTORIES = """
def pytest_collection_modifyitems(items):
    import conformance.test_engine as engine

    engine.HISTORIES_SHARE = 0.2
"""


def _histories(tmp_path, *plugins: str):
    args = ["--canary-impl", "canary_torch", "--hypothesis-profile", "ci", "-k", "histories"]
    for plugin in plugins:
        args += ["-p", plugin]
    return runs.suite(*args, cwd=tmp_path, env=runs.clean_env(CI="true"))


def test_fewer_histories_leave_situations_under_the_floor_and_fail(tmp_path):
    """Able to fail: with 0.2 of the examples the same test fails, naming what it missed."""
    (tmp_path / "half_the_histories.py").write_text(HALF_THE_HISTORIES)
    done = _histories(tmp_path, "half_the_histories")
    assert runs.verdict(done).startswith("verdict: FAILED"), done.stdout[-2000:]
    assert "the histories reached fewer than 3 times" in done.stdout


#: A plugin that unregisters SGLang's tree code: nothing holds the histories' inserts and matches.
NO_TREE = """
def pytest_collection_modifyitems(items):
    from engine_model import free_lists

    free_lists.TREES.clear()
"""


def test_histories_that_sglang_s_tree_does_not_hold_fail(tmp_path):
    """Able to fail: where SGLang's tree code holds none of the histories' inserts and matches
    (its registration lost), the same test fails, naming them."""
    (tmp_path / "no_tree.py").write_text(NO_TREE)
    done = _histories(tmp_path, "no_tree")
    assert runs.verdict(done).startswith("verdict: FAILED"), done.stdout[-2000:]
    assert "SGLang's inserts" in done.stdout and "SGLang's matches" in done.stdout, done.stdout[
        -2000:
    ]
