"""A trial's Reproduce line: the `dsv4bisect run` command that measures exactly its two
configurations (issue 41, item 3).

A trial is "the good end's profile with these patches and settings" judged against the good
end. `run` judges its candidate against the profile with every patch off, the `--set` items
applying to both ends, so where that is not the bisect's good end (two configurations: the
settings are `engine.*` items of the candidate only) the line names the good end with
`--good-config` (the bisect's own `--good-config`, as given). What `run`'s options cannot say
item by item, a trial's removed keys and single server flags (`Overrides.unset`, `.args`), goes
as the whole section it ends up as (`--set engine.env={...}`, `--set engine.args=[...]`).
The line is then resolved back as `run` would resolve it: where either fingerprint differs from
the trial's, the line says so instead of passing for the trial.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dsv4bisect.bisect.question import patch_overrides
from dsv4bisect.config.engine_config import EngineConfig
from dsv4bisect.config.resolve import Overrides, load_profile
from dsv4bisect.errors import Dsv4BisectError


@dataclass(frozen=True)
class ReproduceLine:
    """The `run` line of one trial: its argv and why it is not exact (None: it is)."""

    argv: tuple[str, ...]
    inexact: str | None = None

    def text(self) -> str:
        return shlex.join(self.argv) + (f"  # {self.inexact}" if self.inexact else "")


def run_overrides(profile: str, ov: Overrides) -> Overrides:
    """`ov` as `run`'s options say it (--set, --only): each removed key or edited flag as the
    whole section it leaves (`engine.args`, `engine.env`, ...); a top-level `engine` key removed
    as `null` (its schema default)."""
    if not ov.unset and not ov.args:
        return Overrides(sets=ov.sets, enable=ov.enable, disable=ov.disable, only=ov.only)
    loaded = load_profile(profile, ov).layered.data
    whole: dict[str, str] = {}
    for key in ov.unset:
        parent = key.rsplit(".", 1)[0]
        if parent == "engine":
            whole[key] = "null"
        else:
            whole[parent] = _json_at(loaded, parent, {})
    if ov.args:
        whole["engine.args"] = _json_at(loaded, "engine.args", [])
    kept = tuple(s for s in ov.sets if not any(
        s.split("=", 1)[0].strip() == k or s.startswith(k + ".") for k in whole))
    return Overrides(sets=(*kept, *(f"{k}={v}" for k, v in whole.items())),
                     enable=ov.enable, disable=ov.disable, only=ov.only)


def _json_at(data: object, section: str, empty: object) -> str:
    """The JSON of `section` in the loaded profile (`empty` where it is gone)."""
    node = data
    for part in section.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return json.dumps(node if node is not None else empty)


def trial_line(profile: str, patches: Mapping[str, str], sets: Sequence[str], *, tier: str,
               seed_block: int, good_config: str | None, good: EngineConfig,
               candidate: EngineConfig) -> ReproduceLine:
    """The `dsv4bisect run` line of the trial of `patches` (`good`, `candidate`: the trial's
    two configurations, which the line is checked against)."""
    ov = run_overrides(profile, patch_overrides(patches, sets))
    argv = ["dsv4bisect", "run", profile, "--tier", tier]
    if good_config is not None:
        argv += ["--good-config", good_config]
    for item in ov.sets:  # in the order a run's report prints its own line (run_report)
        argv += ["--set", item]
    argv += ["--only", ",".join(ov.only or ()) or "none"]
    if seed_block:
        argv += ["--seed-block", str(seed_block)]
    return ReproduceLine(tuple(argv), _inexact(profile, ov, good_config, good, candidate))


def _inexact(profile: str, ov: Overrides, good_config: str | None, good: EngineConfig,
             candidate: EngineConfig) -> str | None:
    """Why the line's two configurations are not the trial's, resolved as `run` resolves
    them (run/ends.py); None when both fingerprints are the trial's."""
    from dsv4bisect.run.ends import resolve_ends

    try:
        ends = resolve_ends(profile, ov, good_config)
    except Dsv4BisectError as exc:
        return f"not reproducible with `run`: {exc.message}"
    if ends.candidate.fingerprint != candidate.fingerprint:
        return (f"not exact: `run` resolves the candidate to {ends.candidate.fingerprint}, the "
                f"trial ran {candidate.fingerprint}")
    if ends.good.fingerprint != good.fingerprint:
        return (f"judged against the bisect's good end {good.fingerprint}; `run` judges "
                f"against {ends.good.fingerprint}")
    return None
