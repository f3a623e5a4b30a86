"""SGLang's releases under the suite: the upstream legs and their history.

    python -m conformance.upstream hash             # the installed kv_canary files' content hash
    python -m conformance.upstream check            # the installed release is the one its file was made for
    python -m conformance.upstream expectations     # the installed release's expectations file
    python -m conformance.upstream install RELEASE  # pip install --no-deps sglang==RELEASE (or sglang-RELEASE)
    python -m conformance.upstream run [ARGS]       # check, then the suite on it with its file (ARGS to pytest)
    python -m conformance.upstream table [--check]  # write (or check) docs/UPSTREAM.md

``RELEASES`` is every SGLang release that ships kv_canary, with the content hash of its
kv_canary files (each file's path inside the package and its bytes) and the expectations file
it must match exactly. Releases whose kv_canary files are byte-identical share one file: the
hash is what says so, and ``check`` compares it with the installed files, so each leg
(``tox -e sglang-0.5.NN``) proves the claim for its release. ``tests/suite/test_upstream.py``
checks the table against the installed release and that every release sharing a file has
the same hash.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from conformance import upstream_table

ROOT = Path(__file__).resolve().parent
EXPECTATIONS = ROOT / "expectations"
UPSTREAM_DOC = ROOT.parent / "docs" / "UPSTREAM.md"


@dataclass(frozen=True)
class Release:
    version: str
    kv_canary: str  # the content hash of its kv_canary files (see content_hash)
    expectations: str  # the stem of its file in conformance/expectations/


# Each distinct kv_canary, oldest first: the content hash of its files, then the releases that
# ship it, whose expectations file is named after the first of them. Seven versions: 0.5.13 to
# 0.5.16 in sglang/jit_kernel/kv_canary/ (0.5.14 unquoted the return annotations), 0.5.17 on in
# sglang/kernels/ops/kv_canary/ (0.5.20 added allocation_bytes, 0.5.21 the CPU dispatch, rule 9
# and materialize_real_kv_sources, 0.5.22 rows by stride(0), 0.5.23 its kernel registration).
_KV_CANARY_VERSIONS: tuple[tuple[str, ...], ...] = (
    ("d2bfe1df911d458242b8901dfce8174e66f8a29b240d53533a350df04fd97010", "0.5.13", "0.5.13.post1"),
    (
        "22f527e59fd771b926e62de1b1a88316aa896345684c81426ddc795a192f745c",
        "0.5.14",
        "0.5.15",
        "0.5.15.post1",
        "0.5.16",
    ),
    (
        "22bd5d247f3d31c39bbc74651b22c3548a630fcd706a43670498cdd69afaa5fc",
        "0.5.17",
        "0.5.18",
        "0.5.19",
    ),
    ("0e0948797f86fb8cd3854d642035e4434c60370c74f1030f119062bc47619b97", "0.5.20"),
    ("209a936c83c21b915844505dfd9736f50cb4feecc3d6c23928ab689c601599b3", "0.5.21"),
    ("dd201bc232ee129ef665afef2483a438d34d1fb34c3c24d6e955969f7a59f30e", "0.5.22"),
    ("6b05ada36f95a866b9c4794687ec77f6331382008d817fd38064b4f66a9048a6", "0.5.23"),
)

#: Every release that ships kv_canary, oldest first, with the expectations file it matches.
RELEASES: tuple[Release, ...] = tuple(
    Release(version, kv_canary, f"sglang-{versions[0]}")
    for kv_canary, *versions in _KV_CANARY_VERSIONS
    for version in versions
)
#: Their versions, oldest first.
VERSIONS = tuple(r.version for r in RELEASES)
#: The release the project installs by default (``scripts/_env.sh``, ``tests/installed.py``):
#: the newest. ``tests/tools/test_workflows.py`` holds the scripts' copy to it.
DEFAULT_RELEASE = VERSIONS[-1]


def content_hash(folder: str | os.PathLike) -> str:
    """sha256 over each file of ``folder`` (path inside it and bytes), caches left out."""
    folder = Path(folder)
    digest = hashlib.sha256()
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )
    for path in files:
        relative = path.relative_to(folder).as_posix()
        digest.update(f"{relative}\0{hashlib.sha256(path.read_bytes()).hexdigest()}\n".encode())
    return digest.hexdigest()


def installed_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


#: Where kv_canary lives in a wheel, newest first: (its folder, the folder of the CUDA JIT
#: utilities it imports), below ``sglang/``.
LAYOUTS = (
    ("kernels/ops/kv_canary", "kernels/jit"),  # 0.5.17 and later
    ("jit_kernel/kv_canary", "jit_kernel"),  # 0.5.13 to 0.5.16
)


def sglang_root() -> Path:
    """The installed ``sglang`` package's folder, found without executing it."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("sglang is not installed; pip install --no-deps sglang==X (0.5.13+)")
    return Path(list(spec.submodule_search_locations)[0])


def layout(root: Path) -> tuple[str, str]:
    """(kv_canary's folder, the JIT utilities' folder) of the wheel installed at ``root``."""
    for folder, jit in LAYOUTS:
        if (root / folder / "verify.py").is_file():
            return folder, jit
    places = " or ".join(f"sglang/{folder}/" for folder, _ in LAYOUTS)
    raise ImportError(f"sglang {installed_version()} has no kv_canary in {places}")


def installed_kv_canary() -> Path:
    """The installed wheel's kv_canary folder (either layout)."""
    try:
        root = sglang_root()
        return root / layout(root)[0]
    except ImportError as error:
        raise SystemExit(str(error)) from None


def release(version: str) -> Release:
    for entry in RELEASES:
        if entry.version == version:
            return entry
    known = ", ".join(r.version for r in RELEASES)
    raise SystemExit(f"sglang {version} is not one of the releases under the suite ({known})")


#: The releases whose plan launcher sends CPU tensors to its torch reference (0.5.21 on): their
#: kernel path, the one SGLang takes on CUDA, has a file and a leg of its own
#: (``CANARY_SGLANG_PLAN=kernels``; the tox legs ``sglang-kernels-0.5.NN``). Before 0.5.21 the
#: kernel path is the CPU path, and the release's one file covers it.
KERNEL_PATH_RELEASES = VERSIONS[VERSIONS.index("0.5.21") :]


def reproduces_on(tag: int, version: str | None) -> bool | None:
    """Whether ``docs/UPSTREAM.md``'s divergence ``tag`` reproduces on release ``version`` (its
    range in :data:`conformance.upstream_table.DIVERGENCES`; None: a release not listed)."""
    if version not in VERSIONS:
        return None
    first, last = (VERSIONS.index(v) for v in upstream_table.DIVERGENCES[tag].reproduces)
    return first <= VERSIONS.index(version) <= last


def plan_path() -> str:
    """The plan path the SGLang adapter takes (``CANARY_SGLANG_PLAN``: dispatch or kernels)."""
    return os.environ.get("CANARY_SGLANG_PLAN", "dispatch")


def expectations_file(version: str, path: str | None = None) -> Path:
    """A release's expectations file for plan path ``path`` (default: :func:`plan_path`)."""
    entry = release(version)
    kernels = (path or plan_path()) == "kernels" and version in KERNEL_PATH_RELEASES
    return EXPECTATIONS / f"{entry.expectations}{'-kernels' if kernels else ''}.txt"


def check_installed() -> Release:
    """The installed release, after checking that its kv_canary files are the listed ones."""
    version = installed_version()
    if version is None:
        raise SystemExit("sglang is not installed: pip install --no-deps sglang==X")
    entry = release(version)
    found = content_hash(installed_kv_canary())
    if found != entry.kv_canary:
        raise SystemExit(
            f"sglang {version}: its kv_canary files hash to {found}, not to the {entry.kv_canary} "
            f"that conformance/upstream.py lists; its expectations file "
            f"{entry.expectations}.txt was made for other files"
        )
    return entry


def release_of_env(name: str) -> str:
    """``0.5.13`` of a tox env name ``sglang-0.5.13`` (or of ``0.5.13`` itself)."""
    match = re.fullmatch(r"(?:sglang-(?:kernels-)?)?(\d+\.\d+\.\d+(?:\.post\d+)?)", name)
    if not match:
        raise SystemExit(f"{name!r} names no SGLang release (sglang-0.5.NN)")
    return match.group(1)


def write_table(*, check: bool = False) -> int:
    """Write docs/UPSTREAM.md, or (``check``) exit 1 if it is not what would be written."""
    text = upstream_table.render(RELEASES, EXPECTATIONS)
    if check:
        if (UPSTREAM_DOC.read_text() if UPSTREAM_DOC.exists() else "") != text:
            print(f"{UPSTREAM_DOC} is out of date: python -m conformance.upstream table")
            return 1
        print(f"{UPSTREAM_DOC} is up to date")
        return 0
    UPSTREAM_DOC.write_text(text)
    print(f"wrote {UPSTREAM_DOC}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.upstream", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("hash", help="the installed kv_canary files' content hash")
    commands.add_parser("check", help="check the installed release against RELEASES")
    commands.add_parser("expectations", help="print the installed release's expectations file")
    install = commands.add_parser("install", help="pip install --no-deps sglang==RELEASE")
    install.add_argument("release", help="0.5.NN, or a tox env name sglang-0.5.NN")
    commands.add_parser(
        "run",
        help="the suite on the installed release, with its file, then the runtime legs "
        "(conformance/sglang_runtime.py, conformance/sglang_manager.py)",
    )
    table = commands.add_parser("table", help="write docs/UPSTREAM.md")
    table.add_argument("--check", action="store_true", help="fail if it is out of date")
    options, extra = parser.parse_known_args(argv)
    if extra and options.command != "run":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if options.command == "hash":
        print(content_hash(installed_kv_canary()))
    elif options.command == "check":
        entry = check_installed()
        print(f"sglang {entry.version}: kv_canary {entry.kv_canary[:16]}, {entry.expectations}.txt")
    elif options.command == "expectations":
        path = expectations_file(check_installed().version)
        # relative inside this folder; absolute from elsewhere (an installed copy of the suite)
        print(
            path.relative_to(Path.cwd().resolve())
            if path.is_relative_to(Path.cwd().resolve())
            else path
        )
    elif options.command == "install":
        version = release(release_of_env(options.release)).version
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
        return subprocess.call([*pip, f"sglang=={version}"])
    elif options.command == "run":
        entry = check_installed()
        args = [
            "conformance",
            "--canary-impl",
            "conformance.adapters.sglang",
            "--canary-device",
            "cpu",
            "--canary-expect",
            str(expectations_file(entry.version)),
            # the derandomized ``ci`` profile, unless the arguments name another (.ci/run: its
            # ``mutation`` twin, the same examples, its expected failures left unshrunk)
            *(
                []
                if any(a.startswith("--hypothesis-profile") for a in extra)
                else ["--hypothesis-profile", "ci"]
            ),
            *extra,  # any further pytest arguments
        ]
        status = subprocess.call([sys.executable, "-m", "pytest", *args])
        if status == 5:
            print("error: pytest collected no tests", file=sys.stderr)
            return 1
        # the runtime legs: SGLang's PlanInput, oracle, sweep, perturbations and pool patch
        # over the engine model's histories; then its per-forward manager against the reference
        runtime = subprocess.call([sys.executable, "-m", "conformance.sglang_runtime"])
        manager = subprocess.call([sys.executable, "-m", "conformance.sglang_manager"])
        # the support matrix, every cell (docs/SUPPORT.md, compared on its release);
        # CANARY_MATRIX=off leaves it out (.ci/run, whose self-tests run its quick cells)
        matrix = 0
        if os.environ.get("CANARY_MATRIX", "all") != "off":
            matrix = subprocess.call([sys.executable, "-m", "conformance.sglang.matrix", "--check"])
        return status or runtime or manager or matrix
    elif options.command == "table":
        return write_table(check=options.check)
    return 0


if __name__ == "__main__":
    sys.exit(main())
