"""`dsv4bisect doctor`: is this machine ready to run a profile's patches on SGLang?

Checks, each a row with what to fix: the SGLang version in the engine's Python (or none),
whether that release was verified, and its hook layout; the dsv4bisect entry point visible to
that Python; every hook target of the profile's patches (and every symbol their hook bodies
call) resolvable with the expected signature — by import in the engine's Python when SGLang is
installed there, else statically (AST) in a source tree or wheel given with `--sglang-src`, a
moved one named where it went; the flags SGLang sets for DeepSeek-V4 on SM120, read from that
release's own source; the GPUs visible (nvidia-smi), with the patches whose SGLang path those
GPUs never take; fixed ports free. Pure functions returning rows: no Typer, no Rich, no torch.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from dsv4bisect.base.versions import LAYOUTS, NEWEST_VERIFIED, VERIFIED, SglangInfo, check_version
from dsv4bisect.plugin.static import SourceTree, call_keywords, result_index, sm120_forced_flags
from dsv4bisect.plugin.targets import CONTRACT_TARGET, SIGNATURES, call_contracts, uses

OK, WARN, FAIL = "ok", "warn", "fail"
SM120_ONLY = {"mma-decode": "the SM120 decode entry (flash_mla_with_kvcache_sm120)",
              "triton-indexer": "the SM120 torch indexer (fp8_paged_mqa_logits_torch_sm120)"}


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str
    fix: str = ""


def _py(python: str, code: str, timeout: float = 120) -> tuple[int, str]:
    try:
        p = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, str(exc)
    return p.returncode, (p.stdout if p.returncode == 0 else p.stderr).strip()


def sglang_version(python: str) -> str | None:
    """The sglang distribution's version in `python`, or None when it is not installed."""
    code, out = _py(python, "import importlib.metadata as m; print(m.version('sglang'))")
    return out.splitlines()[-1] if code == 0 and out else None


def check_entry_point(python: str) -> Check:
    code, out = _py(python, "from importlib.metadata import entry_points as e; print([x.value "
                            "for x in e(group='sglang.srt.plugins') if x.name=='dsv4bisect'])")
    if code == 0 and "dsv4bisect.plugin" in out:
        return Check("plugin entry point", OK, f"{python}: {out}")
    return Check("plugin entry point", FAIL, f"{python}: not registered ({out[-200:]})",
                 "pip install /path/to/dsv4bisect (a checkout of the repository) with the "
                 "engine's Python, the same environment as SGLang")


def target_checks(targets: Mapping[str, Iterable[str]], layout: str,
                  src: SourceTree | None, python: str | None) -> list[Check]:
    """One row per (patch, target): static when `src` is given, else by import in `python`."""
    table = SIGNATURES[layout]
    rows: list[Check] = []
    runtime: dict[str, str | None] = {}
    if src is None and python is not None:
        runtime = _runtime_check([t for ts in targets.values() for t in ts], layout, python)
    for patch, ts in targets.items():
        for t in ts:
            sig = table.get(t)
            name = f"{patch}: {t.rsplit('.', 2)[-2]}.{t.rsplit('.', 1)[-1]}"
            if src is None:
                why = runtime.get(t, "not checked")
                how = "import"
            elif sig is not None and sig.external:
                rows.append(Check(name, OK, "outside SGLang: its SGLang call site is checked"))
                continue
            else:
                found = src.resolve(t)
                why = found if isinstance(found, str) else (
                    sig.mismatch(found.param_names) if sig else "no expected signature")
                how = "AST"
            rows.append(Check(name, FAIL if why else OK, f"{how}: {why or 'as expected'}",
                              "" if not why else "this SGLang moved the target: use a verified "
                              f"SGLang ({VERIFIED[0]} to {NEWEST_VERIFIED}) or update dsv4bisect"))
    return rows


def _runtime_check(targets: list[str], layout: str, python: str) -> dict[str, str | None]:
    code = ("import json; from dsv4bisect.plugin.install import check_targets; "
            f"print(json.dumps({{t: check_targets([t], {layout!r}) for t in {targets!r}}}))")
    status, out = _py(python, code, timeout=600)
    if status != 0:
        return {t: f"import check failed: {out[-300:]}" for t in targets}
    return json.loads(out.splitlines()[-1])


def contract_checks(patches: Iterable[str], layout: str, src: SourceTree) -> list[Check]:
    rows = []
    for patch, contracts in call_contracts(layout).items():
        if patch not in patches:
            continue
        for c in contracts:
            calls = src.calls(c.module, c.callee, within=c.within)
            bad = [] if calls else ["no call site"]
            for call in calls:
                kw = set(call_keywords(call))
                if (kw != c.keywords) if c.exact else not c.keywords <= kw:
                    bad.append(f"keywords {sorted(kw)}")
                if c.index is not None and result_index(call, src.tree(c.module)) != c.index:
                    bad.append(f"result not indexed [{c.index}]")
            rows.append(Check(f"{patch}: call {c.callee}", FAIL if bad else OK,
                              f"AST: {'; '.join(bad) or 'as expected'} ({c.why})"))
    return rows


def gpus() -> tuple[list[dict[str, str]], str]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], "nvidia-smi not found"
    try:
        p = subprocess.run([smi, "--query-gpu=index,name,compute_cap,memory.used,memory.total",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], str(exc)
    if p.returncode != 0:
        return [], p.stderr.strip()[-200:]
    keys = ("index", "name", "compute_cap", "memory_used", "memory_total")
    return [dict(zip(keys, (f.strip() for f in line.split(",")))) for line in
            p.stdout.strip().splitlines() if line.strip()], ""


def gpu_checks(found: list[dict[str, str]], why: str, patches: Iterable[str]) -> list[Check]:
    if not found:
        return [Check("GPUs", WARN, why or "no GPU visible",
                      "run doctor on the GPU node that will serve the model")]
    rows = [Check("GPUs", OK, "; ".join(f"{g['index']}: {g['name']} sm_{g['compute_cap']} "
                                        f"({g['memory_used']} / {g['memory_total']})"
                                        for g in found))]
    sm120 = all(g["compute_cap"].startswith("12.") for g in found)
    if not sm120:
        caps = sorted({g["compute_cap"] for g in found})
        for p in patches:
            if p in SM120_ONLY:
                rows.append(Check(f"{p}: path reached", FAIL, f"GPUs sm_{'/'.join(caps)}: "
                                  f"SGLang uses {SM120_ONLY[p]} only on SM120",
                                  f"disable {p} here (its receipts would say never called)"))
    return rows


def port_checks(host: str, ports: Iterable[tuple[str, int]]) -> list[Check]:
    """Each fixed port free, or the process holding it named (the launcher's own check)."""
    from dsv4bisect.engines.ports import port_holder

    rows = []
    for label, port in ports:
        holder = port_holder(host, port)  # None: free for us to bind
        if holder is None:
            rows.append(Check(f"port {port} ({label})", OK, f"{host}:{port} free"))
            continue
        rows.append(Check(f"port {port} ({label})", FAIL, f"{host}:{port}: {holder.describe()}",
                          "stop what holds it or use port: auto"))
    return rows


Declared = Mapping[str, Mapping[str, tuple[str, ...]]]  # patch -> layout -> hook targets


def all_targets(patches: Iterable[str], layout: str,
                declared: Declared) -> dict[str, tuple[str, ...]]:
    """patch -> its hook targets and the symbols its hook bodies call, on this layout."""
    out = {p: tuple(declared[p].get(layout, ())) + uses(p, layout) for p in patches}
    out = {p: ts for p, ts in out.items() if ts}
    out["(contract check)"] = (CONTRACT_TARGET,)
    return out


def forced_flags_check(src: SourceTree | None, version: str | None) -> Check:
    """What this release sets for DeepSeek-V4 on SM120, read from its own server-args code."""
    if src is None:
        return Check("SGLang on SM120 (DeepSeek-V4)", WARN, "source not readable here",
                     "give --sglang-src, or run doctor in the engine's Python")
    flags = sm120_forced_flags(src)
    if not flags:
        return Check("SGLang on SM120 (DeepSeek-V4)", WARN,
                     f"{version}: no DeepSeek-V4 SM120 block found in server args")
    text = ", ".join(f"{f.name}={f.value}{'' if f.forced else ' (if unset)'}" for f in flags)
    return Check(f"SGLang {version} on SM120 (DeepSeek-V4)", OK, text,
                 "forced values override your env; '(if unset)' ones are the switches' defaults")


def installed_source(python: str) -> SourceTree | None:
    """The installed SGLang's source tree in `python`, found without importing SGLang."""
    code, out = _py(python, "import importlib.util as u, pathlib; s = u.find_spec('sglang'); "
                            "print(pathlib.Path(s.origin).parent.parent if s and s.origin else '')")
    path = out.splitlines()[-1].strip() if code == 0 and out else ""
    return SourceTree(Path(path)) if path and (Path(path) / "sglang").is_dir() else None


def source_tree(path: str | None) -> SourceTree | None:
    return None if path is None else SourceTree(Path(path))


def layout_check(version: str | None, where: str,
                 allow_unverified: bool = False) -> tuple[Check, str | None, SglangInfo | None]:
    """The version row and the layout to check targets with. An unverified release is still
    checked statically (with the layout of the range it falls in) so the user sees what
    moved, but the row fails unless `allow_unverified`."""
    if version is None:
        return Check("SGLang", FAIL, f"not installed ({where})",
                     "install SGLang next to dsv4bisect, or give --sglang-src"), None, None
    info = check_version(version, allow_unverified)
    if info.verified:
        if info.layout is None:
            return Check("SGLang", FAIL, f"{version} ({where}): {info.reason}",
                         f"use SGLang {VERIFIED[0]} or newer"), None, info
        return Check("SGLang", OK, f"{version} ({where}): verified, hook layout {info.layout}"), \
            info.layout, info
    if info.layout is not None:  # allowed
        return Check("SGLang", WARN, f"{version} ({where}): unverified; {info.warning}"), \
            info.layout, info
    static = check_version(version, True).layout or LAYOUTS[-1]
    return Check("SGLang", FAIL, f"{version} ({where}): unverified: {info.reason}",
                 f"use a verified release ({VERIFIED[0]} to {NEWEST_VERIFIED}), or pass "
                 "--allow-unverified-sglang to try it anyway"), static, info


_EMBEDDED_PROBE = """\
import json, sys
out = {}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = torch.cuda.is_available()
except Exception as exc:
    out["torch_error"] = repr(exc)[-200:]
    print(json.dumps(out)); sys.exit(0)
try:
    from dsv4bisect.config.checkpoints import checkpoint_dir
    from dsv4bisect.reference.checkpoint import load_model
    from dsv4bisect.reference.config import ModelArgs
    directory = checkpoint_dir(sys.argv[1])
    if directory is None:
        out["checkpoint"] = "random tiny model (seed 0): nothing to load"
        ModelArgs.preset("tiny")
    else:
        model = load_model(directory)
        n = sum(p.numel() for p in model.parameters())
        out["checkpoint"] = f"{directory}: every tensor loaded ({n:,} parameters)"
except Exception as exc:
    out["checkpoint_error"] = (getattr(exc, "message", None) or repr(exc))[-300:]
print(json.dumps(out))
"""


def embedded_checks(python: str, checkpoint: str, device: str = "auto") -> list[Check]:
    """A `kind: reference` profile's engine, in the engine's Python: torch imports there, the
    checkpoint exists and loads (every tensor, strictly, as `serve` loads it), the device asked
    for is there. No SGLang, no GPUs needed."""
    try:
        p = subprocess.run([python, "-c", _EMBEDDED_PROBE, checkpoint], capture_output=True,
                           text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [Check("engine Python", FAIL, f"{python}: {exc}",
                      "set engine.python to an interpreter that has dsv4bisect installed")]
    lines = p.stdout.strip().splitlines()
    try:
        found = json.loads(lines[-1]) if p.returncode == 0 and lines else None
    except ValueError:
        found = None
    if not isinstance(found, dict):
        return [Check("engine Python", FAIL, f"{python}: {(p.stderr or p.stdout)[-200:]}",
                      "install dsv4bisect into the engine's Python")]
    rows = [Check("engine Python", OK, f"{python}: runs dsv4bisect")]
    if "torch_error" in found:
        return rows + [Check("torch", FAIL, f"not importable: {found['torch_error']}",
                             "pip install torch==2.13.0 -e '.[engine]' in that Python")]
    rows.append(Check("torch", OK, f"{found['torch']}" + (", CUDA available" if found["cuda"]
                                                          else ", CPU only")))
    if device == "cuda" and not found["cuda"]:
        rows.append(Check("device", FAIL, "engine.reference.device is cuda; torch sees no GPU",
                          "set engine.reference.device: auto (or cpu)"))
    if "checkpoint_error" in found:
        rows.append(Check(f"checkpoint {checkpoint}", FAIL, found["checkpoint_error"],
                          "set engine.reference.checkpoint to embedded, random or a "
                          "DeepSeek-format checkpoint directory"))
    else:
        rows.append(Check(f"checkpoint {checkpoint}", OK, found["checkpoint"]))
    return rows
