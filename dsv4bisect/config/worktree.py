"""Source patches: a git worktree of the engine checkout per patch subset (cached).

A profile's source patches (a diff file, or a commit range of the engine's git checkout) are
applied in order to a detached worktree of `base`; the worktree is keyed by the base commit and
the content of every applied change, so each subset is built once and reused. Its `pythonpath`
subdirectory goes first on the engine's PYTHONPATH.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from dsv4bisect.config.schema import SourcePatch
from dsv4bisect.env import cache_dir
from dsv4bisect.errors import ConfigError

READY_MARKER = ".dsv4bisect-worktree-ok"


@dataclass(frozen=True)
class SourceChange:
    name: str
    spec: SourcePatch
    profile_dir: Path  # diff paths are relative to the profile that declared them


@dataclass(frozen=True)
class WorktreePlan:
    repo: Path
    base_commit: str
    identity: str  # hash of base commit + every change's content
    path: Path
    pythonpath: Path
    changes: tuple[SourceChange, ...]


def _git(repo: Path, *args: str, stdin: bytes | None = None) -> bytes:
    proc = subprocess.run(["git", "-C", str(repo), *args], input=stdin, capture_output=True)
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        raise ConfigError(
            f"git {' '.join(args[:2])} failed in {repo}: {err[-1] if err else proc.returncode}",
            "check the source patch's repo, base, diff or commit range",
        )
    return proc.stdout


def _change_bytes(change: SourceChange, repo: Path) -> bytes:
    spec = change.spec
    if spec.diff is not None:
        path = (change.profile_dir / spec.diff).expanduser()
        if not path.is_file():
            raise ConfigError(f"source patch `{change.name}`: no diff file {path}", "fix `diff:`")
        return path.read_bytes()
    start, _, end = (spec.commits or "").partition("..")
    return _git(repo, "diff", "--binary", f"{start}..{end}")


def plan_worktree(changes: list[SourceChange]) -> WorktreePlan:
    """Where the worktree for these changes lives; nothing is created yet."""
    repos = {Path(c.spec.repo).expanduser().resolve() for c in changes}
    bases = {c.spec.base for c in changes}
    if len(repos) != 1 or len(bases) != 1:
        raise ConfigError(
            "source patches of one profile must share one `repo` and one `base`",
            "point every source patch at the same engine checkout and base",
        )
    repo, base = repos.pop(), bases.pop()
    if not (repo / ".git").exists():
        raise ConfigError(f"source patch repo {repo} is not a git checkout", "fix `repo:`")
    base_commit = _git(repo, "rev-parse", f"{base}^{{commit}}").decode().strip()
    h = hashlib.sha256(base_commit.encode())
    for change in changes:
        h.update(change.name.encode() + b"\0" + _change_bytes(change, repo) + b"\0")
    identity = h.hexdigest()[:16]
    path = cache_dir() / "worktrees" / identity
    pythonpath = {c.spec.pythonpath for c in changes}.pop()
    return WorktreePlan(repo, base_commit, identity, path, path / pythonpath, tuple(changes))


def materialize(plan: WorktreePlan) -> Path:
    """Create (or reuse) the worktree with every change applied; returns its path."""
    if (plan.path / READY_MARKER).is_file():
        return plan.path
    if plan.path.exists():  # a half-built worktree from an interrupted run
        _git(plan.repo, "worktree", "remove", "--force", str(plan.path))
        shutil.rmtree(plan.path, ignore_errors=True)
    plan.path.parent.mkdir(parents=True, exist_ok=True)
    _git(plan.repo, "worktree", "add", "--detach", str(plan.path), plan.base_commit)
    try:
        for change in plan.changes:
            patch = _change_bytes(change, plan.repo)
            if patch.strip():
                _git(plan.path, "apply", "--whitespace=nowarn", "-", stdin=patch)
    except ConfigError as exc:
        _git(plan.repo, "worktree", "remove", "--force", str(plan.path))
        raise ConfigError(f"applying source patches failed: {exc.message}", exc.hint) from exc
    (plan.path / READY_MARKER).write_text(plan.identity + "\n")
    return plan.path
