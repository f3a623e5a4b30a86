"""The benchmarks' helpers: GPU-type labels, where results are stored, the refusal to compare
runs of different GPU types, the hardware check of the GPU tox legs, the per-worker GPU of
the conformance plugin, and the workloads the benchmarks time. Nothing here is timed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import canary
import reference
from tests import forked

ROOT = Path(__file__).resolve().parents[2]


def _load(relative_path: str, name: str) -> types.ModuleType:
    # By path: under tox the repository root is not on sys.path, only the installed packages.
    spec = importlib.util.spec_from_file_location(name, ROOT / relative_path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


machine = _load("benchmarks/machine.py", "_bench_machine")
report = _load("benchmarks/report.py", "_bench_report")
workloads = _load("benchmarks/workloads.py", "_bench_workloads")
check_gpu_type = _load("tools/check_gpu_type.py", "_check_gpu_type")


# ---------------------------------------------------------------------------------------------
# gpu_type slug and storage


@pytest.mark.parametrize(
    "device_name, slug",
    [
        ("NVIDIA H200", "nvidia-h200"),
        ("NVIDIA H100 80GB HBM3", "nvidia-h100-80gb-hbm3"),
        ("NVIDIA A100-SXM4-80GB", "nvidia-a100-sxm4-80gb"),
        ("AMD Instinct MI300X", "amd-instinct-mi300x"),
        ("  NVIDIA  GH200 480GB ", "nvidia-gh200-480gb"),
        (None, "cpu"),
        ("", "cpu"),
        ("  ", "cpu"),
        ("***", "cpu"),
    ],
)
def test_gpu_type_slug(device_name, slug):
    """A device name becomes a lowercase, dash-separated slug; no GPU is "cpu"."""
    assert machine.gpu_type_slug(device_name) == slug


def test_storage_defaults_to_the_gpu_type_folder(tmp_path):
    """Without --benchmark-storage, runs go to <root>/.benchmarks/<gpu_type>."""
    chosen = machine.choose_storage(
        machine.DEFAULT_STORAGE, ["benchmarks"], tmp_path, "nvidia-h200"
    )
    assert chosen == f"file://{tmp_path.resolve()}/.benchmarks/nvidia-h200"
    assert machine.choose_storage(machine.DEFAULT_STORAGE, [], tmp_path, "cpu").endswith(
        "/.benchmarks/cpu"
    )


@pytest.mark.parametrize(
    "current, args",
    [
        ("file:///shared/runs", ["--benchmark-storage", "file:///shared/runs"]),
        ("file:///shared/runs", ["--benchmark-storage=file:///shared/runs"]),
        # the default value, but asked for explicitly: the user's choice still wins
        (machine.DEFAULT_STORAGE, ["-x", "--benchmark-storage", machine.DEFAULT_STORAGE]),
        # set by some other means (an ini file of another project, a plugin)
        ("file:///elsewhere", []),
    ],
)
def test_a_given_storage_is_kept(tmp_path, current, args):
    """A storage the user names is used as is."""
    assert machine.choose_storage(current, args, tmp_path, "nvidia-h200") == current


def test_storage_given_recognises_both_spellings():
    """--benchmark-storage URI and --benchmark-storage=URI count; similar options do not."""
    assert machine.storage_given(["--benchmark-storage", "x"])
    assert machine.storage_given(["--benchmark-storage=x"])
    assert not machine.storage_given(["--benchmark-save=x", "--benchmark-storage-x"])


# ---------------------------------------------------------------------------------------------
# comparisons across GPU types


def test_same_gpu_type_compares():
    """A compared run of the same gpu_type is accepted."""
    machine.check_comparable(
        {"gpu_type": "nvidia-h200"}, {"machine_info": {"gpu_type": "nvidia-h200"}}
    )


@pytest.mark.parametrize(
    "current, saved_info",
    [
        ("cpu", {"gpu_type": "nvidia-h200"}),
        ("nvidia-h100-80gb-hbm3", {"gpu_type": "nvidia-h200"}),
        ("nvidia-h200", {}),  # saved without a gpu_type: what it measured is unknown
        (None, {"gpu_type": "nvidia-h200"}),
    ],
)
def test_other_gpu_type_is_a_usage_error(current, saved_info):
    """Comparing against another (or an unknown) gpu_type fails, naming both."""
    with pytest.raises(pytest.UsageError) as caught:
        machine.check_comparable({"gpu_type": current}, {"machine_info": saved_info}, "somewhere")
    message = str(caught.value)
    assert repr(saved_info.get("gpu_type")) in message and repr(current) in message
    assert "somewhere" in message


def _pytest_benchmarks(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """``pytest benchmarks/...`` in a fresh interpreter, on the CPU, collecting only."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env["CANARY_DEVICE"] = "cpu"  # read by the suite's plugin and the benchmarks alike
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "--collect-only",
        str(ROOT / "benchmarks" / "test_cpu_fingerprint.py"),
        *args,
    ]
    return forked.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def _saved_run(folder: Path, gpu_type: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    run = {
        "machine_info": {"gpu_type": gpu_type},
        "commit_info": {},
        "benchmarks": [],
        "datetime": "2026-01-01T00:00:00",
        "version": "5.0.0",
    }
    path = folder / "0001_baseline.json"
    path.write_text(json.dumps(run), encoding="utf-8")
    return path


def test_pytest_refuses_a_comparison_across_gpu_types(tmp_path):
    """`pytest benchmarks --benchmark-compare` against an H200 run, on the CPU, exits 4."""
    storage = tmp_path / "runs"
    _saved_run(storage, "nvidia-h200")
    done = _pytest_benchmarks(
        tmp_path, f"--benchmark-storage=file://{storage}", "--benchmark-compare=0001"
    )
    output = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, output
    assert "gpu_type 'nvidia-h200'" in output and "'cpu'" in output, output


def test_pytest_compares_the_same_gpu_type_in_the_given_storage(tmp_path):
    """The same comparison against a CPU run goes ahead, in the storage the user named."""
    storage = tmp_path / "runs"
    _saved_run(storage, "cpu")
    done = _pytest_benchmarks(
        tmp_path, f"--benchmark-storage=file://{storage}", "--benchmark-compare=0001"
    )
    output = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.OK, output
    assert f"gpu_type=cpu, storage file://{storage}" in output, output


def test_pytest_stores_under_the_gpu_type_by_default(tmp_path):
    """Without --benchmark-storage the run's storage is <root>/.benchmarks/cpu."""
    done = _pytest_benchmarks(tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.OK, output
    assert f"storage file://{ROOT}/.benchmarks/cpu" in output, output


# ---------------------------------------------------------------------------------------------
# the hardware check of the GPU legs


@pytest.mark.parametrize(
    "label, parsed",
    [
        ("h200", ("cuda", "h200")),
        ("cuda-h200", ("cuda", "h200")),
        ("CUDA-A100", ("cuda", "a100")),
        ("rocm-mi300", ("rocm", "mi300")),
        ("mi300", ("rocm", "mi300")),
    ],
)
def test_labels_parse(label, parsed):
    """Labels are the tox factor or the whole tox env name."""
    assert check_gpu_type.parse_label(label) == parsed


@pytest.mark.parametrize("label", ["h300", "rocm-h200", "cuda-mi300", "x-cuda-h200", ""])
def test_unknown_or_inconsistent_labels_are_refused(label):
    """An unknown model, or a model under the other vendor, is an error."""
    with pytest.raises(ValueError):
        check_gpu_type.parse_label(label)


@pytest.mark.parametrize(
    "model, device_name, matches",
    [
        ("h200", "NVIDIA H200", True),
        ("h200", "NVIDIA H200 NVL", True),
        ("h200", "NVIDIA GH200 480GB", False),
        ("h200", "NVIDIA H100 80GB HBM3", False),
        ("h100", "NVIDIA H100 80GB HBM3", True),
        ("h100", "NVIDIA H100 PCIe", True),
        ("a100", "NVIDIA A100-SXM4-40GB", True),
        ("a100", "NVIDIA RTX A1000", False),
        ("mi300", "AMD Instinct MI300X gfx942:sramecc+:xnack-", True),
        ("mi300", " gfx942:sramecc+:xnack-", True),
        ("mi300", "AMD Instinct MI250X gfx90a:sramecc+:xnack-", False),
    ],
)
def test_device_names_match_labels(model, device_name, matches):
    """A model matches as a whole token: H200 is not GH200, A100 is not A1000."""
    assert check_gpu_type.name_matches(model, device_name) is matches


def _fake_gpus(monkeypatch, names, *, hip=None, cuda="12.4"):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: bool(names))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(names))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: names[index])
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda index=0: types.SimpleNamespace(gcnArchName="gfx942" if hip else ""),
    )
    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(torch.version, "cuda", None if hip else cuda)


def test_check_passes_when_every_gpu_matches(monkeypatch):
    """Eight H200s pass the cuda-h200 check."""
    _fake_gpus(monkeypatch, ["NVIDIA H200"] * 8)
    ok, message = check_gpu_type.check("cuda-h200")
    assert ok, message


@pytest.mark.parametrize(
    "label, names, hip, reason",
    [
        ("cuda-h200", [], None, "sees no GPU"),
        ("cuda-h200", ["NVIDIA H100 80GB HBM3"], None, "'NVIDIA H100 80GB HBM3'"),
        ("cuda-h100", ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"], None, "cuda:1"),
        ("rocm-mi300", ["NVIDIA H200"], None, "CUDA build"),
        ("cuda-h200", ["AMD Instinct MI300X"], "6.2", "ROCm build"),
    ],
)
def test_check_fails_with_the_reason(monkeypatch, label, names, hip, reason):
    """No GPU, another GPU (on any device) or the other vendor's torch fails, saying what was found."""
    _fake_gpus(monkeypatch, names, hip=hip)
    ok, message = check_gpu_type.check(label)
    assert not ok
    assert reason in message, message


def test_check_script_exit_status(tmp_path):
    """The script exits 1 when it finds no GPU and 2 for an unknown label."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", HIP_VISIBLE_DEVICES="")
    script = str(ROOT / "tools" / "check_gpu_type.py")

    def run(*args):
        return subprocess.run(
            [sys.executable, script, *args], env=env, capture_output=True, text=True, timeout=120
        )

    no_gpu = run("cuda-h200")
    assert no_gpu.returncode == 1 and "H200" in no_gpu.stderr, no_gpu.stderr
    unknown = run("cuda-h300")
    assert unknown.returncode == 2 and "unknown GPU label" in unknown.stderr, unknown.stderr
    assert run().returncode == 2


# ---------------------------------------------------------------------------------------------
# one GPU per pytest-xdist worker


class _FakeConfig:
    def __init__(self, canary_device=None, worker=None):
        self._canary_device = canary_device
        if worker is not None:
            self.workerinput = {"workerid": worker}

    def getoption(self, name, default=None):
        return self._canary_device if name == "--canary-device" else default


@pytest.mark.parametrize(
    "canary_device, worker, expected, made_current",
    [
        ("cuda", "gw5", "cuda:1", True),  # 5 % 4 GPUs
        (None, "gw2", "cuda:2", True),
        ("cuda:3", "gw1", "cuda:3", False),  # an explicit index is kept
        ("cuda", None, "cuda:0", False),  # not a worker: the current device, by its index
        ("cpu", "gw1", "cpu", False),
    ],
)
def test_xdist_workers_take_one_gpu_each(
    monkeypatch, canary_device, worker, expected, made_current
):
    """The suite's device for worker gw<i> is cuda:<i % count> when no index was given."""
    from conformance import plugin

    current = []
    monkeypatch.delenv("CANARY_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    device = plugin._device(_FakeConfig(canary_device, worker))
    assert device == torch.device(expected)
    assert current == ([torch.device(expected)] if made_current else [])


# ---------------------------------------------------------------------------------------------
# workloads and the throughput table


@pytest.fixture(scope="module")
def small_pool():
    layout = workloads.PoolLayout(num_pages=64, page_size=4, kv_heads=1, head_dim=16)
    return layout, workloads.make_pool(layout, "cpu", seed=3)


@pytest.mark.parametrize("mode", [reference.RealKvHashMode.PARTIAL, reference.RealKvHashMode.ALL])
def test_per_slot_fold_equals_the_reference(small_pool, mode):
    """The per-slot pure-Python contender hashes exactly what the reference does."""
    layout, pool = small_pool
    sources = workloads.kv_sources(canary, pool, layout, 3, 32)
    twins = workloads.reference_sources(sources)
    slots = workloads.page_scattered_slots(40, layout, seed=4)
    windows = workloads.read_bytes_per_source(sources, mode)
    got = workloads.per_slot_fingerprint(twins, slots.tolist(), windows)
    want = reference.fingerprint(twins, slots, mode)
    np.testing.assert_array_equal(np.array(got, dtype=np.uint64).view(np.int64), want, strict=True)
    assert workloads.fingerprint_bytes_read(len(slots), windows) == len(slots) * sum(windows)


def test_sources_are_strided_views_of_the_pool(small_pool):
    """Each source reads one layer's K or V through a row stride spanning both."""
    layout, pool = small_pool
    sources = workloads.kv_sources(canary, pool, layout, 4, 16)
    row_stride_bytes = 2 * layout.page_size * layout.bytes_per_token
    assert all(source.row_stride_bytes == row_stride_bytes for source in sources)
    assert all(source.tensor.data_ptr() != pool.data_ptr() for source in sources[:2])
    assert len({source.tensor.data_ptr() for source in sources}) == 4


@pytest.mark.parametrize(
    "make",
    [
        lambda layout: workloads.decode(layout, 8, seed=1),
        lambda layout: workloads.prefill(layout, 2, 9, seed=2),
        lambda layout: workloads.sweep("sweep", layout, num_requests=3, length=7, seed=3),
    ],
    ids=["decode", "prefill", "sweep"],
)
def test_scenarios_write_and_verify_cleanly(small_pool, make):
    """Every scenario uses distinct non-padding slots and its write then verify reports nothing."""
    layout, pool = small_pool
    scenario = make(layout)
    writes = [scenario.setup] + ([scenario.write] if scenario.write else [])
    written = np.concatenate([batch.slots for batch in writes])
    assert len(set(written.tolist())) == written.size and written.min() > 0
    assert scenario.max_slot < layout.capacity

    twins = workloads.reference_sources(workloads.kv_sources(canary, pool, layout, 2, 32))
    all_mode = reference.RealKvHashMode.ALL
    state = workloads.reference_state(twins, all_mode, num_slots=layout.capacity)
    for batch in writes:
        plan, arguments = workloads.reference_write_arguments(batch)
        reference.write(state, plan, **arguments)
    verify_plan = workloads.reference_verify_plan(scenario.verify)
    reference.verify(state, verify_plan, check_verify_expected_token=True)
    assert int(state.violation_write_index[0]) == 0
    assert int(state.kernel_run_counter[0]) == len(writes) + 1

    windows = workloads.read_bytes_per_source(twins, all_mode)
    assert workloads.verify_bytes_read(scenario.verify, windows) >= scenario.verify.num_entries * (
        4 * 8 + 32 + sum(windows)
    )
    if scenario.write is not None:
        assert workloads.write_bytes_read(scenario.write, windows) >= scenario.write.num_entries * (
            3 * 8 + sum(windows)
        )


def test_scale_scenarios_fit_the_cpu_pool():
    """The engine-scale scenarios have the sizes of the suite's engine-scale tests and fit the
    CPU benchmarks' pool (4096 pages of 16 slots, as in benchmarks/conftest.py) once each."""
    layout = workloads.PoolLayout(num_pages=4096, page_size=16, kv_heads=1, head_dim=64)
    scenarios = {name: make(layout) for name, make in workloads.scale_scenarios().items()}
    assert list(scenarios) == ["prefill-1x8192", "sweep-33x1000"]
    assert all(scenario.name == name for name, scenario in scenarios.items())

    prefill = scenarios["prefill-1x8192"]
    assert (prefill.write.num_requests, prefill.write.num_entries) == (1, 8192)
    assert prefill.verify.num_entries == 8192
    sweep = scenarios["sweep-33x1000"]
    assert sweep.write is None and sweep.setup.num_requests == 33
    assert sweep.verify.num_entries == 33_000
    assert int((sweep.verify.prev_slots < 0).sum()) == 33  # one chain head per sequence

    for scenario in scenarios.values():
        writes = [scenario.setup] + ([scenario.write] if scenario.write else [])
        written = np.concatenate([batch.slots for batch in writes])
        assert len(set(written.tolist())) == written.size and written.min() > 0
        assert scenario.max_slot < layout.capacity


def test_throughput_table_shows_figures_and_verdicts():
    """The end-of-run table lists each figure a row has and says whether its target was met."""
    rows = [
        {
            "name": "a",
            "gbps": 3200.0,
            "copy_ratio": 0.9,
            "target": "copy_ratio >= 0.8",
            "meets_target": True,
        },
        {
            "name": "bb",
            "gbps": 100.0,
            "copy_ratio": 0.1,
            "target": "copy_ratio >= 0.8",
            "meets_target": False,
        },
        {"name": "c", "mb_per_s": 130.5},
    ]
    lines = report.table(rows)
    assert lines[0].split()[:3] == ["benchmark", "MB/s", "GB/s"]
    assert "met: copy_ratio >= 0.8" in lines[1] and "3,200.0" in lines[1]
    assert "MISSED: copy_ratio >= 0.8" in lines[2]
    assert "130.5" in lines[3] and lines[3].rstrip().endswith("-")
    assert report.table([]) == []
