"""Regenerate the shipped vLLM data from the verified releases' wheels: the source facts
(`dsv4bisect/base/vllm_data/vllm-<release>.json`: hook targets, by-value imports, call sites,
`vllm serve`'s options, the request models) and the switch catalogs
(`dsv4bisect/patching/switch_data/vllm-<release>.json`), all by AST (docs/vllm.md).

    python tests/benchmarks/gen_vllm_facts.py [RELEASE ...]   # default: every verified one

The wheels come from tests/vllm/vllm_wheels.py's cache (downloaded there when missing, ~1.3 GB for
the five). Prints one line per release. tests/vllm/test_wheels.py (slow) checks that the shipped
files equal this output.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "vllm"))  # vllm_wheels.py

from vllm_wheels import VERSIONS, fetch_wheel

from dsv4bisect.base.vllm_releases import DATA_DIR
from dsv4bisect.patching.switch_catalog import DATA_DIR as SWITCH_DIR
from dsv4bisect.patching.switch_catalog import dumps as dump_catalog
from dsv4bisect.plugin.vllm.discover import discover
from dsv4bisect.plugin.vllm.facts import dumps, extract
from dsv4bisect.plugin.vllm.tree import open_tree

OUT = ROOT / "dsv4bisect" / "base" / DATA_DIR
SWITCHES = ROOT / "dsv4bisect" / "patching" / SWITCH_DIR


def main(releases: list[str]) -> int:
    OUT.mkdir(exist_ok=True)
    failed = 0
    for release in releases or list(VERSIONS):
        wheel, why = fetch_wheel(release)
        if wheel is None:
            print(f"{release}: no wheel ({why})", file=sys.stderr)
            failed += 1
            continue
        tree = open_tree(wheel)
        facts = extract(tree)
        (OUT / f"vllm-{release}.json").write_text(dumps(facts), encoding="utf-8")
        catalog = discover(tree, release)
        (SWITCHES / f"vllm-{release}.json").write_text(dump_catalog(catalog), encoding="utf-8")
        missing = sorted(t for t, v in facts["symbols"].items() if v is None)
        print(f"{release}: {len(facts['cli'])} options, {len(facts['configs'])} configs, "
              f"{sum(v is not None for v in facts['symbols'].values())}/{len(facts['symbols'])} "
              f"symbols; switches {catalog.count('env')} env, {catalog.count('arg')} arg")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
