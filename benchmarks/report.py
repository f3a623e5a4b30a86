"""Throughput figures of a run: kept in each benchmark's ``extra_info`` (so they are saved
with it) and printed as one compact table at the end of the run.

Run as ``python -m benchmarks.report RUN.json ...`` to print the same table from saved runs.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping

# Filled by record() during a run, printed by the conftest at the end of it.
RESULTS: list[dict] = []

MB = 1e6
GB = 1e9

# (extra_info key, column title, format) in the order the table shows them
COLUMNS = (
    ("mb_per_s", "MB/s", "{:,.1f}"),
    ("gbps", "GB/s", "{:,.1f}"),
    ("copy_gbps", "copy GB/s", "{:,.1f}"),
    ("copy_ratio", "vs copy", "{:.2f}"),
    ("read_ratio", "x read time", "{:,.2f}"),
    ("speedup_vs_per_slot_fold", "x per-slot fold", "{:,.1f}"),
    ("median_s", "median us", None),
    ("device_time_s", "device us", None),
)
MICROSECOND_KEYS = ("median_s", "device_time_s")


def median_seconds(benchmark) -> float | None:
    """The median round time of a finished benchmark, or ``None`` when timing was disabled."""
    stats = getattr(benchmark, "stats", None)
    if not stats:
        return None
    return float(stats["median"])


def record(benchmark, **info) -> dict:
    """Add ``info`` to the benchmark's ``extra_info`` and to this run's table."""
    benchmark.extra_info.update(info)
    row = {"group": benchmark.group, "name": benchmark.name, **benchmark.extra_info}
    RESULTS.append(row)
    return row


def _cell(key: str, value) -> str:
    if value is None:
        return "-"
    if key in MICROSECOND_KEYS:
        return f"{value * 1e6:,.1f}"
    fmt = next(f for k, _, f in COLUMNS if k == key)
    return fmt.format(value)


def _verdict(row: Mapping) -> str:
    target = row.get("target")
    if not target:
        return ""
    met = row.get("meets_target")
    return f"{'met' if met else 'MISSED' if met is False else 'n/a'}: {target}"


def table(rows: Iterable[Mapping]) -> list[str]:
    """Lines of a fixed-width table: name, the figures any row has, and the target verdict."""
    rows = list(rows)
    if not rows:
        return []
    used = [(k, title) for k, title, _ in COLUMNS if any(row.get(k) is not None for row in rows)]
    header = ["benchmark", *(title for _, title in used), "target"]
    body = [
        [str(row.get("name", "?")), *(_cell(k, row.get(k)) for k, _ in used), _verdict(row)]
        for row in rows
    ]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]

    def fmt(line: list[str]) -> str:
        first = line[0].ljust(widths[0])
        middle = [cell.rjust(width) for cell, width in zip(line[1:-1], widths[1:-1])]
        return "  ".join([first, *middle, line[-1]]).rstrip()

    return [fmt(header), *(fmt(line) for line in body)]


def rows_from_json(document: Mapping) -> list[dict]:
    """Table rows of a saved pytest-benchmark run."""
    return [
        {"group": bench.get("group"), "name": bench.get("name"), **(bench.get("extra_info") or {})}
        for bench in document.get("benchmarks", [])
    ]


def main(argv: list[str] | None = None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: python -m benchmarks.report RUN.json [RUN.json ...]", file=sys.stderr)
        return 2
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
        info = document.get("machine_info", {})
        gpu = info.get("gpu")
        described = gpu.get("name") if isinstance(gpu, dict) else gpu
        print(f"{path}: gpu_type={info.get('gpu_type')} ({described})")
        for line in table(rows_from_json(document)):
            print("  " + line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
