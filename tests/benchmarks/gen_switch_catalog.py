"""Regenerate the shipped switch catalogs (`dsv4bisect/patching/switch_data/`) from the
verified releases' wheels: the DeepSeek-V4-path switches each release reads, found by AST
(`dsv4bisect.plugin.discover`, docs/sglang.md "Switch discovery").

    python tests/benchmarks/gen_switch_catalog.py [RELEASE ...]   # default: every verified one

The wheels come from tests/sglang/wheels.py's cache (downloaded there when missing). Prints one
line per release: its switch counts (env, arg). tests/sglang/test_switch_catalog.py checks that
the shipped files equal this output.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "sglang"))  # wheels.py

from wheels import VERSIONS, fetch_wheel

from dsv4bisect.patching.switch_catalog import DATA_DIR, dumps
from dsv4bisect.plugin.discover import discover
from dsv4bisect.plugin.static import SourceTree

OUT = ROOT / "dsv4bisect" / "patching" / DATA_DIR


def main(releases: list[str]) -> int:
    OUT.mkdir(exist_ok=True)
    failed = 0
    for release in releases or list(VERSIONS):
        wheel, why = fetch_wheel(release)
        if wheel is None:
            print(f"{release}: no wheel ({why})", file=sys.stderr)
            failed += 1
            continue
        catalog = discover(SourceTree(wheel), release)
        (OUT / f"sglang-{release}.json").write_text(dumps(catalog), encoding="utf-8")
        print(f"{release}: {catalog.count('env')} env, {catalog.count('arg')} arg")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
