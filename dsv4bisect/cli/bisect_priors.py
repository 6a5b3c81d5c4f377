"""`bisect --microtest-priors`: run the microtest on the profile's checkpoint before the search
and turn each candidate's measured error into a prior weight (bisect/microtest_priors.py).

The I/O half: where the profile's checkpoint is and whether it is readable here, which patches
and variants to measure (the bad end's, for the candidates), the MoE backend and contexts the
deployment uses, the run itself (torch is imported inside `run_priors` only), and the lines the
question block prints. docs/bisect.md "Priors from the microtest".
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from dsv4bisect.bisect import priors_cache
from dsv4bisect.bisect.microtest_priors import (
    Coverage,
    MicrotestPriors,
    coverage,
    priors_from_rows,
)
from dsv4bisect.bisect.question import Question
from dsv4bisect.bisect.setting_candidates import is_setting
from dsv4bisect.config.checkpoints import checkpoint_dir
from dsv4bisect.config.resolve import Overrides, load_profile
from dsv4bisect.errors import ConfigError, Dsv4BisectError
from dsv4bisect.microtest.results import Row
from dsv4bisect.microtest.runners import RUNNER_CHOICES
from dsv4bisect.microtest.spec import MICROTESTED
from dsv4bisect.patching.registry import builtin_patches
from dsv4bisect.ui.console import console

_FORCE_HINT = "drop --microtest-priors (or pass --no-microtest-priors) to bisect without them"


def checkpoint_here(q: Question) -> tuple[str | None, str, str]:
    """(the microtest's --checkpoint argument or None, why not, the profile's MoE backend)."""
    engine = load_profile(q.profile, Overrides(sets=q.sets)).profile.engine
    if engine.kind == "reference":
        name = engine.reference.checkpoint if engine.reference else "embedded"
        try:
            checkpoint_dir(name)  # `random` is generated, the others need a config.json
        except ConfigError as e:
            return None, f"the embedded engine's checkpoint is not readable here: {e.message}", \
                engine.moe_backend
        return name, "", engine.moe_backend
    if engine.kind in ("sglang", "vllm"):
        if not engine.model:
            return None, "the profile names no model directory", engine.moe_backend
        path = Path(engine.model).expanduser()
        try:
            readable = (path / "config.json").is_file() and any(path.glob("*.safetensors"))
        except OSError:
            readable = False
        if not readable:
            return None, (f"the checkpoint {engine.model} is not readable here: no config.json "
                          "and safetensors shards"), engine.moe_backend
        return str(path), "", engine.moe_backend
    return None, "a command engine has no checkpoint the microtest can read", engine.moe_backend


def candidate_coverage(q: Question, moe_backend: str) -> dict[str, Coverage]:
    """Per candidate: does the microtest measure what runs here (and if not, why)."""
    builtins = builtin_patches()
    runner = None if moe_backend in RUNNER_CHOICES else moe_backend
    out = {name: coverage(name, q.deliveries.get(name, "reference"),
                          builtins[name].embedded if name in builtins else None,
                          builtin=name in builtins, unmodelled_runner=runner)
           for name in q.candidates}
    for name in q.candidates:
        if is_setting(name):
            out[name] = Coverage(False, "a setting, not a patch: the microtest has no check "
                                 "for it")
        elif out[name].measured and name not in q.bad:
            out[name] = Coverage(False, "off at the bad end (the microtest measures a patch on)")
    return out


def microtest_patches(q: Question, cover: Mapping[str, Coverage]) -> dict[str, str]:
    """The bad end's variants of the measured candidates. nvfp4-dispatch also decides the
    experts' quant method that hash-topk-scaling's contract is checked under, so it is measured
    with it as the search's bad end has it: the candidates at the bad end, the rest as the good
    end has them."""
    chosen = {n: q.bad[n] for n in q.candidates if cover[n].measured}
    searched_bad = {**{n: v for n, v in q.good.items() if n not in q.candidates},
                    **{n: q.bad[n] for n in q.candidates if n in q.bad}}
    if "hash-topk-scaling" in chosen and "nvfp4-dispatch" in searched_bad:
        chosen["nvfp4-dispatch"] = searched_bad["nvfp4-dispatch"]
    order = {name: i for i, name in enumerate(MICROTESTED)}
    return dict(sorted(chosen.items(), key=lambda kv: order[kv[0]]))


def run_priors(q: Question, checkpoint: str, moe_backend: str,
               contexts: Sequence[int] | None = None, device: str | None = None,
               use_cache: bool = True) -> MicrotestPriors:
    """Run the microtest for the candidates (the bad end's variants) and map its rows to
    priors. `contexts`: the context lengths the bisect's probe reaches (default the
    microtest's 1k..128k); `device`: default CUDA when present (our Triton kernels), else CPU.
    With the default device the priors are cached (bisect/priors_cache.py): a later bisect of
    the same question, checkpoint and code takes them from there (`use_cache=False`: measure
    again and replace the entry)."""
    start = time.monotonic()
    cover = candidate_coverage(q, moe_backend)
    patches = microtest_patches(q, cover)
    key = None
    if patches and device is None:
        key = priors_cache.priors_key(q.candidates, cover, patches, checkpoint, moe_backend,
                                      contexts)
        hit = priors_cache.lookup(key) if use_cache else None
        if hit is not None:
            return hit
    rows: tuple[Row, ...] = ()
    if patches:
        console().print(f"microtest priors: measuring {', '.join(patches)} on {checkpoint} ...",
                        style="dim", markup=False, highlight=False)
        import torch

        from dsv4bisect.microtest.run import run_microtest
        from dsv4bisect.microtest.spec import DEFAULT_CONTEXTS, MicrotestSpec

        spec = MicrotestSpec(
            patches=patches, checkpoint=checkpoint,
            contexts=tuple(sorted(set(contexts))) if contexts else DEFAULT_CONTEXTS,
            device=device or ("cuda" if torch.cuda.is_available() else "cpu"),
            runners=(moe_backend,) if moe_backend in RUNNER_CHOICES else RUNNER_CHOICES)
        rows = run_microtest(spec).rows
    priors = priors_from_rows(q.candidates, rows, cover, time.monotonic() - start, checkpoint)
    if key is not None:
        priors_cache.store(key, priors)
    return priors


def probe_lengths(q: Question, tier: str | None) -> tuple[int, ...]:
    """The context lengths the profile's probe reaches at `tier` (the trials' probe)."""
    from dsv4bisect.bisect.question import patch_overrides
    from dsv4bisect.config.resolve import resolve
    from dsv4bisect.run.ends import probe_spec

    return tuple(probe_spec(resolve(q.profile, patch_overrides(q.good, q.sets)), tier).lengths)


def bisect_priors(q: Question, requested: bool | None, *, test_cmd: bool,
                  tier: str | None = None, use_cache: bool = True) -> MicrotestPriors:
    """What `bisect` multiplies its prior weights by. `requested`: the flag (None: on when the
    profile's checkpoint is readable here and the engine, not `--test-cmd`, judges). Forced on
    where it cannot run is bad input; in the default mode a microtest that cannot run turns the
    priors off with the reason. The microtest runs at the contexts of the profile's probe at
    `tier` (a 128k row says nothing about a probe that never goes past 2k)."""
    if requested is False:
        return MicrotestPriors.disabled("--no-microtest-priors")
    if requested is None and test_cmd:
        return MicrotestPriors.disabled("--test-cmd judges, not the profile's engine "
                                        "(--microtest-priors turns them on)")
    checkpoint, why, backend = checkpoint_here(q)
    if checkpoint is None or importlib.util.find_spec("torch") is None:
        why = why or "torch is not installed (pip install 'dsv4bisect[engine]')"
        if requested:
            raise ConfigError(f"--microtest-priors: {why}", _FORCE_HINT)
        return MicrotestPriors.disabled(why)
    try:
        return run_priors(q, checkpoint, backend, probe_lengths(q, tier), use_cache=use_cache)
    except Dsv4BisectError as e:  # e.g. missing tensors, named by the microtest
        if requested:
            raise
        return MicrotestPriors.disabled(f"the microtest cannot run: {e.message}")


def say_priors(p: MicrotestPriors, weights: Mapping[str, float]) -> None:
    """The question block's priors: each candidate's final weight, multiplier and reason."""
    con = console()
    if p.off:
        con.print(f"microtest priors: off ({p.off})", style="dim", markup=False, highlight=False)
        return
    source = f"cached, measured {p.cached} in {p.seconds:.1f} s" if p.cached \
        else f"{p.seconds:.1f} s"
    con.print(f"microtest priors ({p.checkpoint}, {source}; weight = tier or "
              "bisect.priors weight x multiplier):", markup=False, highlight=False)
    width = max(len(c.name) for c in p.priors) if p.priors else 0
    for c in p.priors:
        con.print(f"  {c.name:<{width}}  {weights.get(c.name, c.multiplier):5.2f}  "
                  f"x{c.multiplier:.2f}  {c.reason}", markup=False, highlight=False)
