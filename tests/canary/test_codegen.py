"""Properties of the compiled kernels that decide GPU speed, checked on CPU from the compiler's
own output (Triton IR, PTX for sm_90, AMDGCN for gfx942), for every variant the launchers make.

- The fold reads source bytes with 16-byte vector loads (PTX ``ld.global.v2.b64``/``.v4``,
  AMDGCN ``global_load_dwordx4``), never byte loads, and nothing spills.
- Addresses are 64-bit all the way: no value is truncated to 32 bits in the Triton IR (but a
  value that is only stored, into an int32 tensor), every integer turned into a pointer is an i64, and the PTX has no 32-bit multiply (a source past
  2**32 bytes stays correct).
- The division by ``page_size`` happens once per slot and source: no 64-bit division or
  remainder inside a loop of the PTX.

Each check is also run on a compile-only known-bad module that has the bug it targets
(``strength/known_bad/compile_*``, ``strength/known_bad/addr_int32_row_offset``) and must fail there.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tools import compile_check
from tools.gpu_types import by_label

ROOT = Path(__file__).resolve().parents[2]
TARGETS = {"sm90": by_label("h200"), "gfx942": by_label("mi300")}
FOLDING = ("fingerprint_kernel", "verify_kernel")  # the kernels that read source bytes


@pytest.fixture(scope="module", params=sorted(TARGETS))
def compiled(request) -> tuple[str, list[compile_check.Compiled]]:
    """Every variant compiled for one target (Triton's cache makes a second run quick)."""
    results = compile_check.check_target(TARGETS[request.param])
    failed = [
        f"{item.kernel} {item.specialization}: {item.error}" for item in results if item.error
    ]
    assert not failed, "variants failed to compile:\n" + "\n".join(failed)
    return request.param, results


@pytest.fixture(scope="module")
def sm90() -> list[compile_check.Compiled]:
    """Every variant compiled for sm_90, whose PTX shows the loops plainly."""
    return compile_check.check_target(TARGETS["sm90"])


def reads_sources(item: compile_check.Compiled) -> bool:
    return item.kernel in FOLDING and "NUM_SOURCES=0" not in item.specialization


# ----------------------------------------------------------------------------- the checks


def fold_load_problems(asm: str, kind: str) -> list[str]:
    """What keeps the fold of a source-reading kernel from 16-byte loads."""
    problems = []
    if kind == "ptx":
        wide = re.findall(r"ld\.global(?:\.\w+)*\.(?:v2\.b64|v2\.u64|v4\.b32|v4\.u32)\b", asm)
        narrow = re.findall(r"ld\.global(?:\.\w+)*\.[bsu]8\b", asm)
    else:
        wide = re.findall(r"\b(?:global|buffer)_load_dwordx4\b", asm)
        narrow = re.findall(r"\b(?:global|buffer)_load_[su]byte\w*\b", asm)
    if not wide:
        problems.append("no 16-byte vector load of source words")
    if narrow:
        problems.append(f"{len(narrow)} byte load(s): {sorted(set(narrow))}")
    return problems


def only_stored(ttir: str, name: str) -> bool:
    """Whether the IR value ``name`` is used, and only as the value a ``tt.store`` stores."""
    uses = [
        line
        for line in ttir.splitlines()
        if re.search(rf"{re.escape(name)}\b", line) and not line.strip().startswith(f"{name} =")
    ]
    stored = rf"\s*tt\.store %[\w#]+, {re.escape(name)}\b"
    return bool(uses) and all(re.match(stored, line) for line in uses)


def address_problems(ttir: str) -> list[str]:
    """32-bit arithmetic that can reach an address, as the Triton IR shows it. A truncation
    whose result is only stored is data, not an address: the plan's int32 num_valid, the
    scatter's 32-bit cut of a token (CONTRACT §12, §13)."""
    problems = []
    truncations = [
        line
        for line in re.findall(r"(%[\w#]+) = (arith\.trunci .*)", ttir)
        if not only_stored(ttir, line[0])
    ]
    if truncations:
        problems.append(f"{len(truncations)} truncation(s) to a narrower integer")
    for line in re.findall(r"tt\.int_to_ptr .*", ttir):
        if not re.search(r":\s*(?:tensor<[^>]*x)?i64\b", line):
            problems.append(f"a pointer made from a non-i64 integer: {line.strip()[:120]}")
    return problems


def ptx_multiply_problems(ptx: str) -> list[str]:
    """32-bit multiplies in PTX: every product in these kernels (row * stride, slot * stride,
    the hash's own) is 64-bit, so a 32-bit one is an address or a hash computed too narrow."""
    narrow = re.findall(r"\b(?:mul|mad)\.lo\.[su]32\b", ptx)
    return [f"{len(narrow)} 32-bit multiply(ies)"] if narrow else []


def loop_bodies(ptx: str) -> list[list[str]]:
    """The lines of each PTX loop: from a label to a later branch back to it."""
    lines = ptx.splitlines()
    labels = {}
    for number, line in enumerate(lines):
        found = re.match(r"^(\$L__\w+):", line.strip())
        if found:
            labels[found.group(1)] = number
    bodies = []
    for number, line in enumerate(lines):
        found = re.search(r"\bbra(?:\.uni)?\s+(\$L__\w+);", line)
        if found and labels.get(found.group(1), number + 1) <= number:
            bodies.append(lines[labels[found.group(1)] : number + 1])
    return bodies


def division_problems(ptx: str) -> list[str]:
    """64-bit divisions or remainders inside a loop (one per word, not one per slot)."""
    problems = []
    for body in loop_bodies(ptx):
        divisions = [line.strip() for line in body if re.search(r"\b(?:div|rem)\.[su]64\b", line)]
        if divisions:
            problems.append(f"{len(divisions)} 64-bit division(s) in a loop: {divisions[:2]}")
    return problems


# ----------------------------------------------------------------------------- on canary


def test_the_fold_reads_sources_with_16_byte_loads(compiled):
    """Every source-reading variant loads source words 16 bytes at a time, never bytes."""
    leg, results = compiled
    kind = "ptx" if leg.startswith("sm") else "amdgcn"
    checked = [item for item in results if reads_sources(item)]
    assert len(checked) >= 4 + 2 * 2 * 4  # fingerprint 1-4 sources; verify 1-4 x flag x align
    for item in checked:
        problems = fold_load_problems(item.asm[kind], kind)
        assert not problems, f"{leg} {item.kernel} {item.specialization}: {problems}"


def test_no_variant_spills(compiled):
    """No variant spills registers to local memory / scratch."""
    leg, results = compiled
    for item in results:
        assert item.spill_bytes == 0, f"{leg} {item.kernel} {item.specialization} spills"
        assert item.registers is not None and item.registers > 0


def test_addresses_are_64_bit(compiled):
    """No kernel truncates a value to 32 bits or makes a pointer from a 32-bit integer."""
    leg, results = compiled
    for item in results:
        problems = address_problems(item.asm["ttir"])
        if "ptx" in item.asm:
            problems += ptx_multiply_problems(item.asm["ptx"])
        assert not problems, f"{leg} {item.kernel} {item.specialization}: {problems}"


def test_page_division_is_once_per_slot(sm90):
    """No 64-bit division or remainder runs inside a loop of any variant (sm_90 PTX)."""
    assert all(item.error is None for item in sm90)
    assert any(loop_bodies(item.asm["ptx"]) for item in sm90 if reads_sources(item))
    for item in sm90:
        problems = division_problems(item.asm["ptx"])
        assert not problems, f"sm90 {item.kernel} {item.specialization}: {problems}"


# ----------------------------------------------------------------------------- on mutants


def compile_mutant(module: str, leg: str, tmp_path: Path) -> list[dict]:
    """The fingerprint variants compiled under ``module`` (in a process of its own)."""
    script = (
        f"import {module}, sys\n"
        "from tools import compile_check\n"
        f"sys.exit(compile_check.main(['--target', '{leg}', '--kernel', 'fingerprint_kernel',"
        f" '--asm-dir', {str(tmp_path)!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    index = json.loads((tmp_path / f"{leg}-variants.json").read_text())
    for item in index:
        item["text"] = {kind: (tmp_path / name).read_text() for kind, name in item["asm"].items()}
    return index


@pytest.mark.parametrize("leg", sorted(TARGETS))
def test_fold_load_check_fails_on_word_loads(leg, tmp_path):
    """The load check fails on the old fold (8-byte loads from unaligned integer addresses)."""
    kind = "ptx" if leg.startswith("sm") else "amdgcn"
    variants = compile_mutant("strength.known_bad.compile_fold_word_loads", leg, tmp_path)
    assert variants and all(fold_load_problems(item["text"][kind], kind) for item in variants)


def test_address_check_fails_on_int32_row_offsets(tmp_path):
    """The address check fails on a fold whose row offset wraps to int32."""
    variants = compile_mutant("strength.known_bad.addr_int32_row_offset", "sm90", tmp_path)
    assert variants and all(address_problems(item["text"]["ttir"]) for item in variants)
    assert all(ptx_multiply_problems(item["text"]["ptx"]) for item in variants)


def test_division_check_fails_on_division_per_word(tmp_path):
    """The division check fails on a fold that divides by the page size per chunk."""
    variants = compile_mutant("strength.known_bad.compile_fold_divides_per_word", "sm90", tmp_path)
    assert variants and all(division_problems(item["text"]["ptx"]) for item in variants)
