"""The gate's shards: a correct implementation's whole-suite run dealt out to several runs by
module (``strength/shards.py``, ``strength.gate --shards``), merged into one row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from strength import gate, shards

TARGETS = [
    gate.Target("strength.known_bad.a", "hashing", "killed", "bug a"),
    gate.Target("good", gate.CORRECT_AREA, "passes"),
]


def test_the_shards_deal_every_module_once_and_end_together():
    """Each module of the suite is in exactly one shard, the shards keep the suite's order,
    and two shards carry about the same seconds (the histories' module the only heavy one of its
    shard)."""
    paths = gate.suite_paths()
    for n in (1, 2, 3, len(paths) + 1):
        parts = shards.split(paths, n)
        assert len(parts) == n and sorted(p for part in parts for p in part) == sorted(paths)
        assert all(part == [p for p in paths if p in part] for part in parts)
    first, second = shards.split(paths, 2)
    heavy = [p for p in first if shards.MODULE_SECONDS.get(Path(p).name, 1) > 3]
    assert heavy == ["conformance/test_engine.py"]
    weight = [sum(shards.MODULE_SECONDS.get(Path(p).name, 1) for p in part) for part in (first, second)]  # fmt: skip
    assert abs(weight[0] - weight[1]) <= 0.1 * sum(weight)
    with pytest.raises(ValueError, match="at least 1"):
        shards.split(paths, 0)


def test_a_sharded_run_is_one_row_whose_seconds_and_tests_add_up(tmp_path, capsys):
    """With --shards 2 the correct implementation runs as two suite runs, whose selections
    make up the whole suite, and is one row of the table and the JSON; a mutant stays one
    run; a failing shard fails the row."""
    seen: list[gate.Target] = []

    def run(target: gate.Target) -> gate.Result:
        seen.append(target)
        if target.expected == gate.KILLED:
            return gate.Result(target, gate.KILLED, 1.0, 1, "conformance/test_x.py::test_y")
        i, _ = target.shard
        outcome = gate.PASSES if i == 1 or not failing else gate.KILLED
        return gate.Result(target, outcome, 2.0 * i, 0 if outcome == gate.PASSES else 1,
                           None, tests={"passed": 10 * i})  # fmt: skip

    targets = TARGETS
    for failing in (False, True):
        seen.clear()
        report = tmp_path / f"gate-{failing}.json"
        status = gate.main(["--shards", "2", "--json", str(report)], targets=targets, runner=run)
        assert sorted(t.name for t in seen) == [
            "good (shard 1 of 2)", "good (shard 2 of 2)", "strength.known_bad.a"
        ]  # fmt: skip
        halves = [gate.target_selection(t) for t in seen if t.module == "good"]
        assert sorted(halves[0] + halves[1]) == sorted(gate.suite_paths())
        rows = json.loads(report.read_text())["results"]
        assert [r["target"]["module"] for r in rows] == ["strength.known_bad.a", "good"]
        assert rows[1]["seconds"] == 6.0 and rows[1]["tests"] == {"passed": 30}
        assert rows[1]["outcome"] == ("killed" if failing else "passes")
        assert status == int(failing)
    assert "good (shard 2 of 2): killed" in capsys.readouterr().err
