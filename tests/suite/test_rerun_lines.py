"""Every rerun line a run prints works when pasted as printed, in the same shell, from the
folder the run started in: the ``Reproduce with:`` blocks of the stored vectors and of the
engine-scale tier name the run's own Python (not whatever ``pytest`` is on the PATH) and the
suite's test by module (not by a path that exists only at the repository root)."""

from __future__ import annotations

import re
import shlex
import sys

import pytest

from conformance import report

from .runs import command_word, pasted, suite

#: a fingerprint that hashes with another constant: every hash differs from the reference's
WRONG_HASHES = "strength.known_bad.hash_golden_gamma"
#: one test of each kind of block, each failing on WRONG_HASHES
FAILING = {
    "a stored vector": "conformance/test_golden.py::test_fingerprint_vector[fp-spec-16-bytes-all]",
    "an engine-scale vector": "conformance/test_golden_scale.py::test_scale_vector[fp-scale-page-96]",
    "an engine-scale property": "conformance/test_scale.py::test_big_pages_and_pools_fingerprint_equals_reference",
}  # fmt: skip


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory):
    """The three tests run from a folder outside the repository, on wrong hashes."""
    folder = tmp_path_factory.mktemp("rerun-lines")
    done = suite(*FAILING.values(), "--canary-impl", WRONG_HASHES, "--canary-no-shrink",
                 cwd=folder)  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    return folder, done.stdout


def reproduce_blocks(out: str) -> dict[str, str]:
    """{test id: the lines of its ``Reproduce with:`` block} of a run's failures section."""
    blocks = {}
    for match in re.finditer(r"^Reproduce with:\n((?: {4}.*\n)+)", out, re.M):
        first = shlex.split(match[1].splitlines()[0].rstrip(" \\"), comments=True)
        target = next(arg for arg in first if "::" in arg)
        blocks[target] = match[1]
    return blocks


@pytest.mark.parametrize("kind", FAILING)
def test_a_reproduce_block_pasted_in_the_runs_folder_reruns_its_test(failed_run, kind):
    folder, out = failed_run
    test_id = FAILING[kind]
    module, _, rest = test_id.partition("::")
    target = f"{module.removesuffix('.py').replace('/', '.')}::{rest}"
    blocks = reproduce_blocks(out)
    assert target in blocks, f"no block naming {target}: {sorted(blocks)}\n{out[-3000:]}"
    block = blocks[target]
    assert command_word(block.strip()) == sys.executable, block
    done = pasted(block, cwd=folder)
    assert done.returncode == 1, block + done.stdout[-3000:] + done.stderr[-2000:]
    assert re.search(r"^=* ?1 failed in ", done.stdout, re.M), done.stdout[-2000:]


def test_the_announced_rerun_line_is_the_blocks_command(failed_run):
    """The paragraph announcing a failure and the block at the end give the same command."""
    _, out = failed_run
    announced = re.findall(r"^    rerun alone: (.*)$", out, re.M)
    assert announced and all(command_word(line) == sys.executable for line in announced)
    assert report.rerun_command("conformance/test_x.py::test_y").startswith(
        f"{shlex.quote(sys.executable)} -m pytest -p conformance.plugin --pyargs "
    )
