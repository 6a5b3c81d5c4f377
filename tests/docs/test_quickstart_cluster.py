"""docs/quickstart-cluster.md cannot rot: its commands run here, as written, in order.

The page's conventions (its last section says the same):
- each line of a ```bash block is a command, run verbatim in a scratch directory; exit 0;
- `# needs: sglang` at the end of a line: it needs SGLang and GPUs, so it runs with the
  embedded profile `reference-all` in place of `mydeploy.yaml` (printed and recorded);
  `# needs: sglang, hours` (the launching bisect) also gets `--plan`; `# needs: node` (the
  install into SGLang's environment) is not run here;
- a ```yaml block after `<!-- edit: FILE -->` is merged into FILE key by key (the hand edit);
- a ```text block after `<!-- output of: COMMAND -->`: each of its lines is a line of that
  command's output; the cost table's figures follow from the two `--plan` outputs.
The embedded smoke `run` (70-110 s here) runs in the `slow` test; everything else in ~15 s.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

PAGE = Path(__file__).parents[2] / "docs" / "quickstart-cluster.md"
MARKED = "mydeploy.yaml"  # the user's profile on the page
EMBEDDED = "reference-all"  # what runs here in its place
SLOW = ("run",)  # subcommands whose embedded stand-in takes minutes: the slow test runs them
NEEDS = re.compile(r"\s+#\s*needs:\s*(?P<what>[\w ,]+)$")
PLAN = re.compile(r"expected wall ≈ (?P<wall>[^(]+?) \(p90 (?P<p90wall>[^)]+)\), expected "
                  r"launches (?P<launches>[\d.]+), trials")
COST = re.compile(r"^  (?P<name>launch|full probe \(\w+ tier\)): (?P<s>\d+) s — ")


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    tag: tuple[str, str] | None  # ("edit", FILE) | ("output of", COMMAND) from an HTML comment


@dataclass(frozen=True)
class Command:
    line: str  # as on the page, marker removed
    needs: str | None

    def argv(self) -> tuple[list[str] | None, str]:
        """What runs here, and why it differs from the page (empty: verbatim)."""
        if self.needs == "node":
            return None, "not run here: needs the node's SGLang environment"
        argv = shlex.split(self.line)
        why = ""
        if self.needs in ("sglang", "sglang, hours"):
            argv = [EMBEDDED if a == MARKED else a for a in argv]
            why = f"needs SGLang: ran with the embedded profile {EMBEDDED} for {MARKED}"
            if self.needs == "sglang, hours":
                argv.append("--plan")
                why += ", and --plan (it launches for hours)"
        elif self.needs is not None:
            raise AssertionError(f"unknown marker `# needs: {self.needs}` in the page")
        assert argv[0] == "dsv4bisect", f"page command not a dsv4bisect command: {self.line}"
        return [sys.executable, "-m", "dsv4bisect", *argv[1:]], why

    @property
    def slow(self) -> bool:
        argv, _ = self.argv()
        return argv is not None and argv[3] in SLOW


def blocks(page: str = PAGE.read_text()) -> list[Block]:
    out, lines, i = [], page.splitlines(), 0
    while i < len(lines):
        m = re.match(r"^```(\w+)\s*$", lines[i])
        if not m:
            i += 1
            continue
        prev = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        tag = re.match(r"^<!--\s*(edit|output of):\s*(.+?)\s*-->$", prev)
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        out.append(Block(m.group(1), "\n".join(lines[i + 1:end]),
                         (tag.group(1), tag.group(2)) if tag else None))
        i = end + 1
    return out


def commands(block: Block) -> list[Command]:
    out = []
    for line in block.text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = NEEDS.search(line)
        out.append(Command(line[:m.start()] if m else line.rstrip(),
                           m.group("what").strip() if m else None))
    return out


def merge(base: dict[str, Any], edit: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in edit.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _run(cmd: Command, cwd: Path, record: Any) -> subprocess.CompletedProcess[str] | None:
    argv, why = cmd.argv()
    print(f"page: {cmd.line}" + (f"\n  {why}" if why else ""))
    record(cmd.line, why or "verbatim")
    if argv is None:
        return None
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)
    print(f"  exit {proc.returncode} in {time.monotonic() - t0:.1f} s")
    return proc


def _lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line.rstrip() for line in (proc.stdout + "\n" + proc.stderr).splitlines()]


def test_page_markers_are_the_documented_ones() -> None:
    cmds = [c for b in blocks() if b.lang == "bash" for c in commands(b)]
    assert {c.needs for c in cmds} <= {None, "node", "sglang", "sglang, hours"}
    steps = [c.line for c in cmds]
    order = ["profile new mydeploy --from dsv4-flash-tp8-latest", "doctor mydeploy.yaml",
             "run mydeploy.yaml --tier smoke", "bisect mydeploy.yaml --plan",
             "bisect mydeploy.yaml"]
    at = [next(i for i, s in enumerate(steps) if s == f"dsv4bisect {o}") for o in order]
    assert at == sorted(at), steps
    assert any(c.needs == "node" and "pip install" in c.line for c in cmds)
    assert "pip install dsv4bisect" not in PAGE.read_text()  # no PyPI claim


@pytest.mark.slow  # plans of the standard tier: ~1 min of simulation on 2 cores (issue 42's 400 runs)
def test_walkthrough_commands_run_here(tmp_path: Path, record_property: Any) -> None:
    outputs: dict[str, list[str]] = {}
    ran: list[tuple[str, str]] = []
    for block in blocks():
        if block.lang == "bash":
            for cmd in commands(block):
                if cmd.slow:
                    print(f"page: {cmd.line}\n  in the slow test (the embedded run takes minutes)")
                    continue
                proc = _run(cmd, tmp_path, lambda line, why: ran.append((line, why)))
                if proc is None:
                    continue
                outputs[cmd.line] = _lines(proc)
                assert proc.returncode == 0, f"{cmd.line}\n{proc.stdout}\n{proc.stderr}"
        elif block.tag and block.tag[0] == "edit":
            path = tmp_path / block.tag[1]
            path.write_text(yaml.safe_dump(merge(yaml.safe_load(path.read_text()),
                                                 yaml.safe_load(block.text))))
            print(f"edited {block.tag[1]} as the page says")
        elif block.tag and block.tag[0] == "output of":
            live = outputs[block.tag[1]]
            for line in block.text.splitlines():
                assert line.rstrip() in live, (block.tag[1], line, live)
    record_property("walkthrough", ran)
    assert (tmp_path / MARKED).is_file()
    _check_cost_table(outputs)


def _check_cost_table(outputs: dict[str, list[str]]) -> None:
    page = PAGE.read_text()

    def plan(cmd: str) -> dict[str, str]:
        line = next(x for x in outputs[cmd] if x.startswith("plan:"))
        m = PLAN.search(line)
        assert m, line
        return m.groupdict()

    def costs(cmd: str) -> dict[str, int]:
        found = (COST.match(x) for x in outputs[cmd])
        return {m["name"].split(" (")[0]: int(m["s"]) for m in found if m}

    std = plan("dsv4bisect bisect mydeploy.yaml --plan")
    std_costs = costs("dsv4bisect bisect mydeploy.yaml --plan")
    smoke_costs = costs("dsv4bisect bisect mydeploy.yaml --plan --tier smoke")
    rows = {r.split("|")[1].strip(): r for r in page.splitlines() if r.startswith("| ")}
    launch, p_std, p_smoke = std_costs["launch"], std_costs["full probe"], smoke_costs[
        "full probe"]
    assert smoke_costs["launch"] == launch
    for figure in (launch, p_std, p_smoke):
        assert f"**{figure} s**" in page
    assert f"2 × ({launch} s + {p_smoke} s)" in rows["smoke run"]
    assert f"| {round(2 * (launch + p_smoke) / 60)} min |" in rows["smoke run"]
    assert f"| {std['launches']} |" in rows["bisect"]
    assert f"| {std['wall']} (p90 {std['p90wall']}) |" in rows["bisect"]


def test_doctor_on_the_embedded_profile(tmp_path: Path) -> None:
    cmd = next(c for b in blocks() if b.lang == "bash" for c in commands(b)
               if c.line.startswith("dsv4bisect doctor"))
    proc = _run(cmd, tmp_path, lambda *_: None)
    assert proc is not None and proc.returncode == 0, proc.stdout if proc else ""


def test_new_profile_inherits_the_base_patches(tmp_path: Path) -> None:
    """The page says the new profile inherits the base's patches (before the edit)."""
    new = next(c for b in blocks() if b.lang == "bash" for c in commands(b)
               if c.line.startswith("dsv4bisect profile new"))
    base = new.line.split("--from")[1].split()[0]
    assert _run(new, tmp_path, lambda *_: None).returncode == 0  # type: ignore[union-attr]

    def patches(ref: str) -> dict[str, str]:
        import json

        out = subprocess.run([sys.executable, "-m", "dsv4bisect", "profile", "show", ref,
                              "--resolved", "--json"], cwd=tmp_path, capture_output=True,
                             text=True, check=True).stdout
        return {p["name"]: p["variant"] for p in json.loads(out)["patches"]}

    assert patches(MARKED) == patches(base)


@pytest.mark.slow
def test_walkthrough_smoke_run_on_the_embedded_engine(tmp_path: Path,
                                                      record_property: Any) -> None:
    """The `run` step, substituted: the embedded smoke run ends with a verdict and a run dir."""
    slow = [c for b in blocks() if b.lang == "bash" for c in commands(b) if c.slow]
    assert slow, "the page has a run step"
    for cmd in slow:
        t0 = time.monotonic()
        proc = _run(cmd, tmp_path, lambda line, why: record_property(line, why))
        assert proc is not None
        record_property("seconds", round(time.monotonic() - t0))
        assert proc.returncode in (0, 1, 4), proc.stderr[-2000:]  # a verdict, not 5 / 125
        out = "\n".join(_lines(proc))
        assert re.search(r"^(PASS|FAIL|WARN)\s+reference-all \(smoke tier", out, re.M), out
        assert "run dir: runs/" in out
