"""The golden vectors' command line: regenerate or check conformance/golden/*.json.

python -m conformance.golden            # say what regenerating would change; write nothing
python -m conformance.golden --write    # regenerate conformance/golden/*.json
python -m conformance.golden --check    # exit 1 if regenerating would change any file
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from conformance.golden import COMMAND, GOLDEN_DIR, changes, render

__all__ = ["main"]


def main(argv: Sequence[str] | None = None, directory: Path = GOLDEN_DIR) -> int:
    parser = argparse.ArgumentParser(
        prog=COMMAND, description="Regenerate or check the golden vectors from the reference."
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help="write the regenerated files")
    group.add_argument(
        "--check", action="store_true", help="exit 1 if regenerating would change any file"
    )
    args = parser.parse_args(argv)
    rendered = render()
    found = changes(rendered, directory)
    counts = ", ".join(
        f"{name}: {len(json.loads(text)['vectors'])}" for name, text in rendered.items()
    )
    if args.write:
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in rendered.items():
            path = directory / name
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                path.write_text(text, encoding="utf-8")
        print("\n".join(found) if found else "golden vectors already up to date")
        print(f"vectors: {counts}")
        return 0
    if not found:
        print(f"golden vectors up to date ({counts})")
        return 0
    print("\n".join(found))
    if args.check:
        print(f"golden vectors are stale: run `{COMMAND} --write` if the change is deliberate")
        return 1
    print(f"(nothing written; `{COMMAND} --write` writes these changes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
