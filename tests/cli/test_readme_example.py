"""The README's `dsv4bisect run` example shows the fingerprints and the probe spec hash of the
current code, so it cannot go stale.

The fingerprint is the same on any machine (it hashes tracked file contents under relative
names, never paths), but it covers the patch, kernel, plugin and embedded-engine code: any change
there is a new experiment and changes the example. Regenerate the example's identifiers with
`DSV4BISECT_UPDATE_README=1 python -m pytest tests/cli/test_readme_example.py` and commit the
README; the measured figures (accuracies, seconds) come from a real run and are not rewritten.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from dsv4bisect.config.resolve import Overrides
from dsv4bisect.run.ends import probe_spec, resolve_ends

README = Path(__file__).parents[2] / "README.md"
HEX = r"([0-9a-f]{16})"


def _example(text: str) -> str:
    start = text.index("### What `run` prints")
    found = re.compile(r"```\n(PASS|WARN|FAIL)  reference-all").search(text, start)
    assert found, "README lacks the `run` example"
    block = found.start()
    return text[block:text.index("\n```\n", block + 4)]


def _current() -> dict[str, str]:
    ends = resolve_ends("reference-all", Overrides())
    return {"spec": probe_spec(ends.candidate, "smoke").spec_hash(),
            "baseline": ends.good.fingerprint, "candidate": ends.candidate.fingerprint}


def _shown(example: str) -> dict[str, str]:
    found = {"spec": re.search(rf"spec {HEX}", example),
             "baseline": re.search(rf"^  baseline .*\[{HEX}\]$", example, re.M),
             "candidate": re.search(rf"^  candidate .*\[{HEX}\]$", example, re.M)}
    missing = [k for k, m in found.items() if m is None]
    assert not missing, f"README example lacks {missing}"
    return {k: m.group(1) for k, m in found.items() if m is not None}


def test_readme_run_example_shows_the_current_identifiers() -> None:
    text = README.read_text()
    example = _example(text)
    shown, now = _shown(example), _current()
    run_dir = re.search(r"run dir: runs/\S+-reference-all-([0-9a-f]{8})$", example, re.M)
    assert run_dir, "README example lacks its run dir line"
    if os.environ.get("DSV4BISECT_UPDATE_README") and (shown != now or
                                                       run_dir.group(1) != now["candidate"][:8]):
        fixed = example
        for key in shown:
            fixed = fixed.replace(shown[key], now[key])
        fixed = fixed.replace(f"-reference-all-{run_dir.group(1)}",
                              f"-reference-all-{now['candidate'][:8]}")
        README.write_text(text.replace(example, fixed))
        shown, run_dir_id = now, now["candidate"][:8]
    else:
        run_dir_id = run_dir.group(1)
    assert shown == now, ("README.md's run example is stale; regenerate with "
                          "DSV4BISECT_UPDATE_README=1 python -m pytest "
                          "tests/cli/test_readme_example.py")
    assert run_dir_id == now["candidate"][:8]


def test_the_candidate_line_lists_what_reference_all_turns_on() -> None:
    example = _example(README.read_text())
    ends = resolve_ends("reference-all", Overrides())
    names = [p.name + (" (inert)" if p.inert else "") for p in ends.candidate.patches]
    assert f"  candidate {', '.join(names)}  [" in example
