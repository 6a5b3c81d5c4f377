"""The commands and exit a run's report names: the `run` that asks the same question again
(Reproduce), the `bisect` that finds which patch did it (the next step after a FAIL or a WARN),
and the exit the command had (pure: read from run.json and the verdict).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from dsv4bisect.errors import policy_exit
from dsv4bisect.probe.verdict import exit_code_as
from dsv4bisect.report.run_view import RunView


def reproduce_command(run: dict[str, Any]) -> str:
    """The `dsv4bisect run` command line that asks the same question again."""
    argv = ["dsv4bisect", "run", str(run.get("profile")), "--tier", str(run.get("tier")),
            *_override_args(run)]
    block = (run.get("probe") or {}).get("seed_block")
    if block:
        argv += ["--seed-block", str(block)]
    return shlex.join(argv)


def _override_args(run: dict[str, Any]) -> list[str]:
    """The candidate's overrides as typed: `run` and `bisect` take the same ones."""
    argv: list[str] = []
    ov = run.get("overrides") or {}
    for s in ov.get("sets") or ():
        argv += ["--set", s]
    for name in ov.get("enable") or ():
        argv += ["--enable", name]
    for name in ov.get("disable") or ():
        argv += ["--disable", name]
    if ov.get("only") is not None:  # `none`: every patch off (an empty --only is refused)
        argv += ["--only", ",".join(ov["only"]) or "none"]
    return argv


def bisect_command(view: RunView) -> str | None:
    """The `dsv4bisect bisect` that finds which of the candidate's patches did what this run
    saw (a FAIL or a drift WARN), with the run's profile, overrides, tier and runs root; None
    when there is nothing to bisect (a PASS, no verdict, fewer than two patches differ)."""
    v, run = view.verdict, view.run
    if v is None or v.verdict not in ("FAIL", "WARN") or len(differing_patches(run)) < 2:
        return None
    argv = ["dsv4bisect", "bisect", str(run.get("profile")), "--tier", str(run.get("tier")),
            *_override_args(run)]
    root = view.run_dir.parent
    if root != Path("runs"):
        argv += ["--out", str(root)]
    return shlex.join(argv)


def differing_patches(run: dict[str, Any]) -> list[str]:
    """The candidate's patches (`name` or `name:variant`) that its good end does not run as
    it does, inert ones left out: what a bisect of this run searches."""
    arms = run.get("arms") or {}
    good = (arms.get("baseline") or {}).get("patch_set") or {}
    cand = arms.get("candidate") or {}
    inert = set(cand.get("inert") or ())
    return [patch_label(name, variant) for name, variant in (cand.get("patch_set") or {}).items()
            if good.get(name) != variant and name not in inert]


def patch_label(name: str, variant: str) -> str:
    """`name`, or `name:variant` for a variant other than the patch's default."""
    from dsv4bisect.patching.registry import builtin_patches

    patch = builtin_patches().get(name)
    return name if patch is not None and variant == patch.default_variant else \
        f"{name}:{variant}"


def next_step(view: RunView) -> str | None:
    """The line that names the next step after a FAIL or a drift WARN (None after a PASS)."""
    v = view.verdict
    if v is None or v.verdict not in ("FAIL", "WARN"):
        return None
    what = "lost the facts" if v.verdict == "FAIL" else "drifts"
    command = bisect_command(view)
    if command is not None:
        return f"next: find which patch {what}: {command}"
    differ = differing_patches(view.run)
    if len(differ) == 1:
        return (f"next: the candidate differs from its good end only in {differ[0]}: that "
                f"patch {what}, there is nothing to bisect")
    return None


def exit_words(view: RunView) -> str:
    """The exit the command had (`dsv4bisect run` records how it maps a verdict to its exit:
    run.json `exit`), said apart from the verdict's own code where they differ (a drift WARN
    exits 0 by default; verdict.json keeps 4). A run without that record (a bisect trial's: no
    process exits with it) gives the verdict's code."""
    run, v = view.run, view.verdict
    own = v.exit_code if v is not None else run.get("exit_code")
    how = run.get("exit")
    if not isinstance(how, dict) or not isinstance(own, int):
        return f"the verdict's code {own}" if v is not None else f"exit code {own}"
    warn_exit, policy = str(how.get("warn_as", "pass")), str(how.get("policy", "default"))
    code = exit_code_as(v.verdict, warn_exit) if v is not None else own
    final = policy_exit(code, policy)
    if final == own:
        return f"exit {final}"
    why = (f"a drift WARN under `--warn-as {warn_exit}`" if v is not None and code != own else
           "nothing was measured: `--exit-policy git-bisect`")
    keeps = "verdict.json keeps the verdict's" if v is not None else "the error's"
    return f"exit {final} ({why}; {keeps} code {own})"
