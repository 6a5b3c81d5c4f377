"""User patches: env/args patches and source patches materialised as git worktrees."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dsv4bisect.config.resolve import Overrides, resolve
from dsv4bisect.errors import ConfigError


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture()
def engine_repo(tmp_path: Path) -> Path:
    """A small engine checkout: python/engine/ops.py with a function a patch changes."""
    repo = tmp_path / "engine"
    (repo / "python" / "engine").mkdir(parents=True)
    (repo / "python" / "engine" / "ops.py").write_text("def scale():\n    return 1.0\n")
    _git(repo.parent, "init", "-q", str(repo))
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    return repo


def _profile(tmp_path: Path, repo: Path, source: str) -> Path:
    path = tmp_path / "fork.yaml"
    path.write_text(f"""schema_version: 1
name: my-fork
engine:
  kind: sglang
  model: /models/x
  tp: 1
custom_patches:
  fast-scale:
    summary: return a faster scale
    tier: 1
    source:
      repo: {repo}
{source}
  my-flag:
    summary: turn on an env flag
    env: {{MY_FLAG: 1}}
    args: [--my-arg]
patches:
  fast-scale: true
  my-flag: true
""")
    return path


def test_diff_source_patch_resolves_to_a_worktree_with_the_change(tmp_path, engine_repo) -> None:
    diff = tmp_path / "fast.diff"
    diff.write_text("""--- a/python/engine/ops.py
+++ b/python/engine/ops.py
@@ -1,2 +1,2 @@
 def scale():
-    return 1.0
+    return 2.0
""")
    profile = _profile(tmp_path, engine_repo, "      diff: fast.diff")
    cfg = resolve(str(profile), materialize_worktree=True)
    worktree = Path(cfg.worktree)
    assert (worktree / "python" / "engine" / "ops.py").read_text().endswith("return 2.0\n")
    assert (engine_repo / "python" / "engine" / "ops.py").read_text().endswith("return 1.0\n")
    env = cfg.process("server").env_dict()
    assert env["PYTHONPATH"] == "{worktree}/python"
    assert env["MY_FLAG"] == "1" and "--my-arg" in cfg.process("server").argv
    proc = cfg.materialize({"server": 30000}, "python3")[0]
    assert dict(proc.env)["PYTHONPATH"] == f"{worktree}/python"
    # Cached: resolving again reuses the same worktree; the fingerprint is path-independent.
    again = resolve(str(profile), materialize_worktree=True)
    assert again.worktree == cfg.worktree and again.fingerprint == cfg.fingerprint
    # A different subset (source patch off) has no worktree and another fingerprint.
    off = resolve(str(profile), Overrides(disable=("fast-scale",)))
    assert off.worktree is None and off.fingerprint != cfg.fingerprint
    assert "PYTHONPATH" not in off.process("server").env_dict()


def test_commit_range_source_patch(tmp_path, engine_repo) -> None:
    start = _git(engine_repo, "rev-parse", "HEAD")
    (engine_repo / "python" / "engine" / "ops.py").write_text("def scale():\n    return 3.0\n")
    _git(engine_repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "fast")
    end = _git(engine_repo, "rev-parse", "HEAD")
    source = f"      commits: {start}..{end}\n      base: {start}"
    cfg = resolve(str(_profile(tmp_path, engine_repo, source)), materialize_worktree=True)
    ops = Path(cfg.worktree) / "python" / "engine" / "ops.py"
    assert ops.read_text().endswith("return 3.0\n")


def test_diff_that_does_not_apply_is_a_clear_error(tmp_path, engine_repo) -> None:
    diff = tmp_path / "bad.diff"
    diff.write_text("--- a/python/engine/ops.py\n+++ b/python/engine/ops.py\n@@ -1,2 +1,2 @@\n"
                    " def other():\n-    return 9.0\n+    return 2.0\n")
    profile = _profile(tmp_path, engine_repo, "      diff: bad.diff")
    with pytest.raises(ConfigError, match="applying source patches failed"):
        resolve(str(profile), materialize_worktree=True)
