"""Preflight: what would stop an SGLang launch, found in seconds instead of after one; and
`dsv4bisect doctor`'s checks, as the same `Finding`s.

`run` and `bisect` (not `--plan`, not `--test-cmd`) call `require(profile, overrides)` before
anything is launched; `doctor PROFILE` shows the same checks as rows (`doctor_rows`) after its
own (the last sections below).
`--skip-preflight` skips it. Checks, in order (docs/run.md, "Preflight"):

1. **engine Python**: the interpreter the profile launches (`engine.python`, default `python3`
   on PATH) runs;
2. **SGLang**: installed there, at a verified release (`base.versions.check_version`; an
   unverified one only with `engine.allow_unverified_sglang` or
   `DSV4BISECT_ALLOW_UNVERIFIED_SGLANG=1`), equal to the profile's `engine.sglang_version` pin,
   and `import sglang` succeeds there;
3. **plugin**: the `dsv4bisect` entry point is registered in that Python
   (`check_entry_point`, the row `doctor` shows);
4. **model**: `engine.model` is a directory with a `config.json` whose `architectures` name
   DeepSeek-V4 (`DeepseekV4ForCausalLM`) and whose quantization matches `engine.expert_quant`;
5. **GPUs**: every GPU the profile names is visible (`nvidia-smi --query-gpu=...`), runs no
   compute process (`--query-compute-apps=...`) and has >= 90 % of its memory free;
6. **ports**: every fixed port (the processes' `port`, the PD bootstrap port) is free, else its
   holder is named (`engines.ports.port_holder`: the launcher's own check).

Embedded (`kind: reference`) and `kind: command` profiles get the port check only. A failure
is one `error:` line and a `hint:`: `ConfigError` (exit 5) for a setup to fix, `EngineError`
(exit 125) for something transient (a port or a GPU someone else is using).

`doctor`'s own checks, a row each with what to fix: the SGLang version in the engine's Python
(or none), whether that release was verified, and its hook layout; the dsv4bisect entry point
visible to that Python; every hook target of the profile's patches (and every symbol their
hook bodies call) resolvable with the expected signature — by import in the engine's Python
when SGLang is installed there, else statically (AST) in a source tree or wheel given with
`--sglang-src`, a moved one named where it went; the flags SGLang sets for DeepSeek-V4 on
SM120, read from that release's own source; the GPUs visible (nvidia-smi), with the patches
whose SGLang path those GPUs never take; each fixed port free. For a `kind: reference`
profile: the embedded engine's Python, torch and checkpoint instead.

Pure functions returning `Finding`s; no Typer, no Rich, no torch.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from dsv4bisect.base.bounded import load_json
from dsv4bisect.base.versions import (
    FIRST_SUPPORTED,
    LAYOUTS,
    NEWEST_VERIFIED,
    VERIFIED,
    SglangInfo,
    allowed_by_env,
    check_version,
)
from dsv4bisect.config.checkpoints import CONFIG_NAME, load_checkpoint_config
from dsv4bisect.config.engine_config import EngineConfig
from dsv4bisect.config.resolve import LoadedProfile, Overrides, load_profile, resolve_loaded
from dsv4bisect.engines import ports as portcheck
from dsv4bisect.engines.finding import Finding
from dsv4bisect.errors import ConfigError
from dsv4bisect.patchspec.spec import Patch
from dsv4bisect.plugin.static import SourceTree, call_keywords, result_index, sm120_forced_flags
from dsv4bisect.sglang_hooks.targets import CONTRACT_TARGET, SIGNATURES

DSV4_ARCHITECTURES = ("DeepseekV4ForCausalLM",)
MIN_FREE = 0.90  # of each named GPU's memory
PY_TIMEOUT_S = 120.0  # `import sglang` on a cold node
SMI_TIMEOUT_S = 30.0
GPU_QUERY = ("--query-gpu=index,uuid,memory.used,memory.total", "--format=csv,noheader,nounits")
APPS_QUERY = ("--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
              "--format=csv,noheader,nounits")

_PROBE = """\
import json, sys
out = {"python": sys.executable, "python_version": sys.version.split()[0], "sglang": None,
       "import_error": None}
try:
    import importlib.metadata as m
    out["sglang"] = m.version("sglang")
except Exception:
    pass
if out["sglang"] is not None:
    try:
        import sglang
    except BaseException as e:
        out["import_error"] = (type(e).__name__ + ": " + str(e)).splitlines()[0][:300]
print(json.dumps(out))
"""


def _ok(check: str, detail: str) -> Finding:
    return Finding(check, "ok", detail)


def _fail(check: str, detail: str, hint: str, transient: bool = False) -> Finding:
    return Finding(check, "fail", detail, hint, transient)


def require(profile: str, overrides: Overrides = Overrides()) -> list[Finding]:
    """Run the preflight for a profile (with the command line's overrides) and raise the first
    failure as the project's error; return the findings when nothing failed."""
    loaded = load_profile(profile, overrides)
    cfg = resolve_loaded(loaded)
    if cfg.cannot_start:  # the command refuses it itself, naming the patch: a sharper error
        return []
    findings = preflight(loaded, cfg)
    enforce(findings)
    return findings


def enforce(findings: Iterable[Finding]) -> None:
    for f in findings:
        if f.failed:
            raise f.error()


def preflight(loaded: LoadedProfile, cfg: EngineConfig,
              python: str | None = None) -> list[Finding]:
    """Every check for this configuration, in order; a check that depends on a failed one is
    skipped. `python` replaces the profile's engine interpreter (doctor --python)."""
    out: list[Finding] = []
    if cfg.kind == "vllm":
        from dsv4bisect.engines.vllm_checks import preflight_rows

        engine = loaded.profile.engine
        out += preflight_rows(cfg, python or engine_python(cfg), engine.vllm_version,
                              engine.allow_unverified_vllm)
        out.append(model_check(cfg.model, engine.expert_quant))
        out.append(gpu_check(named_gpus(cfg)))
    if cfg.kind == "sglang":
        engine = loaded.profile.engine
        out += sglang_checks(python or engine_python(cfg), engine.sglang_version,
                             engine.allow_unverified_sglang)
        out.append(model_check(cfg.model, engine.expert_quant))
        out.append(gpu_check(named_gpus(cfg)))
    out.append(port_check(cfg.host, fixed_ports(cfg)))
    return out


# -- the engine's Python and SGLang -----------------------------------------------------------


def engine_python(cfg: EngineConfig) -> str:
    """The interpreter of the processes that load the plugin (as the launcher runs it)."""
    procs = [p for p in cfg.processes if p.gets_patches] or list(cfg.processes)
    exe = procs[0].argv[0] if procs else "python3"
    return sys.executable if exe == "{python}" else exe


def sglang_checks(python: str, pin: str | None, allow_unverified: bool) -> list[Finding]:
    """engine Python runs; SGLang installed, verified, as pinned, importable; plugin registered."""
    exe = shutil.which(python) or python
    fix_py = "set engine.python to the interpreter of the SGLang environment"
    if shutil.which(python) is None and not Path(python).is_file():
        return [_fail("engine Python", f"engine Python `{python}` not found (PATH or file)",
                      fix_py)]
    try:
        proc = subprocess.run([exe, "-c", _PROBE], capture_output=True, text=True,
                              timeout=PY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return [_fail("engine Python", f"engine Python {exe} did not answer within "
                      f"{PY_TIMEOUT_S:.0f} s", fix_py)]
    except OSError as exc:
        return [_fail("engine Python", f"engine Python {exe} does not run: {exc}", fix_py)]
    try:
        info: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        said = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:200]
        return [_fail("engine Python", f"engine Python {exe} does not run: {said}", fix_py)]
    out = [_ok("engine Python", f"{exe}: Python {info['python_version']}")]
    version = info["sglang"]
    if version is None:
        return out + [_fail("SGLang", f"SGLang is not installed in the engine Python {exe}",
                            f"install SGLang {pin or NEWEST_VERIFIED} there, or set "
                            "engine.python to the Python that has it")]
    allow = allow_unverified or allowed_by_env()
    ver = check_version(version, allow)
    if ver.layout is None:
        too_old = ver.version_tuple is not None and ver.version_tuple[:3] < FIRST_SUPPORTED
        return out + [_fail("SGLang", f"{ver.reason} (in {exe})",
                            f"install a verified release ({VERIFIED[0]} to {NEWEST_VERIFIED}) "
                            "there" + ("" if too_old else
                                       ", or set engine.allow_unverified_sglang: true"))]
    if pin is not None and pin.strip() != version.strip():
        return out + [_fail("SGLang", f"SGLang {version} is installed in {exe} but the profile "
                            f"pins engine.sglang_version {pin}",
                            f"pip install sglang=={pin} into that environment, or pin the "
                            f"release you run: --set engine.sglang_version={version} (or "
                            "engine.sglang_version in the profile)")]
    if info["import_error"]:
        return out + [_fail("SGLang", f"SGLang {version} is installed in {exe} but `import "
                            f"sglang` fails: {info['import_error']}",
                            f"repair that environment (pip install sglang=={version} there)")]
    note = "verified" if ver.verified else "unverified, allowed"
    out.append(_ok("SGLang", f"{version} in {exe} ({note}, hook layout {ver.layout})"))
    ep = check_entry_point(exe)
    if ep.status != "ok":
        out.append(_fail("plugin", f"the dsv4bisect plugin is not registered in {exe} "
                         "(entry point dsv4bisect in group sglang.srt.plugins)",
                         "pip install /path/to/your/dsv4bisect/checkout with that Python "
                         "(docs/quickstart-cluster.md)"))
    else:
        out.append(_ok("plugin", ep.detail))
    return out


# -- the model ---------------------------------------------------------------------------------


def model_check(model: str | None, expert_quant: str | None) -> Finding:
    """The model directory exists, its config.json names DeepSeek-V4, its quantization matches."""
    fix = "set engine.model to the checkpoint directory (--set engine.model=/path/to/model)"
    if not model:
        return _fail("model", "the profile sets no engine.model", fix)
    d = Path(model)
    if not d.is_dir():
        return _fail("model", f"model directory {model} does not exist", fix)
    cfg_path = d / CONFIG_NAME
    if not cfg_path.is_file():
        return _fail("model", f"{cfg_path} is missing: not a Hugging Face checkpoint", fix)
    try:
        cfg = load_checkpoint_config(d)  # the bounded loader every reader uses
    except ConfigError as exc:
        return _fail("model", exc.message, fix)
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list) or not any(a in DSV4_ARCHITECTURES for a in archs):
        return _fail("model", f"{cfg_path}: architectures {archs!r}, not DeepSeek-V4 "
                     f"({', '.join(DSV4_ARCHITECTURES)})", fix + " of a DeepSeek-V4 model")
    found, how = checkpoint_quant(d, cfg)
    if expert_quant is not None and found != expert_quant:
        return _fail("model", f"{model}: routed experts are {found} ({how}) but the profile "
                     f"says engine.expert_quant: {expert_quant}",
                     f"point engine.model at the {expert_quant} checkpoint, or set "
                     f"engine.expert_quant: {found} if that is the one you deploy")
    return _ok("model", f"{model}: {', '.join(archs)}, experts {found} ({how})")


def checkpoint_quant(d: Path, cfg: Mapping[str, Any]) -> tuple[str, str]:
    """How the checkpoint stores its routed experts — nvfp4 | mxfp4 | fp8 | bf16 | the raw
    quant_method — and the evidence: config.json's `quantization_config` (`quant_method`
    `modelopt` is NVIDIA ModelOpt; DeepSeek's own `fp8` with `expert_dtype fp4` is MXFP4) and
    ModelOpt's `hf_quant_config.json` (`quantization.quant_algo`)."""
    qc = cfg.get("quantization_config") or {}
    qc = qc if isinstance(qc, Mapping) else {}
    algo = None
    hf_path = d / "hf_quant_config.json"
    if hf_path.is_file():
        try:
            hf = load_json(hf_path, "checkpoint-config")
            algo = (hf.get("quantization", hf) or {}).get("quant_algo")
        except (ConfigError, AttributeError):
            algo = None
    method = str(qc.get("quant_method") or "").lower()
    algo = algo or qc.get("quant_algo")
    if algo is not None or method.startswith("modelopt"):
        a = str(algo or "").upper()
        how = f"quant_method {method or 'modelopt'}, quant_algo {algo}"
        if "NVFP4" in a or a in ("MIXED_PRECISION", "") or method in ("modelopt_fp4",
                                                                     "modelopt_mixed"):
            return "nvfp4", how
        return ("fp8" if "FP8" in a else a.lower()), how
    expert = str(qc.get("expert_dtype", cfg.get("expert_dtype")) or "").lower()
    if method == "fp8":
        return ("mxfp4" if expert in ("fp4", "mxfp4") else "fp8"), \
            f"quant_method fp8{', expert_dtype ' + expert if expert else ''}"
    if method:
        return method, f"quant_method {method}"
    return "bf16", "no quantization_config"


# -- GPUs --------------------------------------------------------------------------------------


def named_gpus(cfg: EngineConfig) -> list[int]:
    return sorted({g for p in cfg.processes for g in p.gpus})


def gpu_check(gpus: list[int], smi: str | None = None) -> Finding:
    """Each named GPU visible, running no compute process, with >= 90 % of its memory free."""
    if not gpus:
        return Finding("GPUs", "skip", "the profile names no GPUs")
    names = ",".join(map(str, gpus))
    smi = smi or shutil.which("nvidia-smi")
    if smi is None:
        return _fail("GPUs", f"nvidia-smi not found: cannot see GPUs {names} that the profile "
                     "names", "run on the GPU node, with NVIDIA's driver tools on PATH")
    try:
        rows = _smi(smi, GPU_QUERY)
        apps = _smi(smi, APPS_QUERY)
    except RuntimeError as exc:
        return _fail("GPUs", f"nvidia-smi failed: {exc}", "check the NVIDIA driver "
                     "(nvidia-smi must run on this node)")
    table: dict[int, tuple[str, float, float]] = {}
    for r in rows:
        try:
            table[int(r[0])] = (r[1], float(r[2]), float(r[3]))
        except (IndexError, ValueError):
            return _fail("GPUs", f"cannot read nvidia-smi's line {', '.join(r)!r}",
                         "check the NVIDIA driver")
    missing = [g for g in gpus if g not in table]
    if missing:
        seen = ",".join(map(str, sorted(table))) or "none"
        return _fail("GPUs", f"GPU {','.join(map(str, missing))} named by the profile is not "
                     f"visible (nvidia-smi shows {seen})", "set engine.gpus (and tp) to "
                     "GPUs this node has")
    by_uuid = {uuid: idx for idx, (uuid, _, _) in table.items()}
    for app in apps:
        idx = by_uuid.get(app[0])
        if idx in gpus:
            name = app[2] if len(app) > 2 else "?"
            mem = f", {app[3]} MiB" if len(app) > 3 else ""
            return _fail("GPUs", f"GPU {idx} is busy: PID {app[1]} ({name}{mem}) runs on it",
                         "wait for it to finish or stop it, or name free GPUs in engine.gpus",
                         transient=True)
    for g in gpus:
        _, used, total = table[g]
        free = 1 - used / total if total > 0 else 0.0
        if free < MIN_FREE:
            return _fail("GPUs", f"GPU {g} has only {free:.0%} of its memory free ({used:.0f} "
                         f"of {total:.0f} MiB used; needs >= {MIN_FREE:.0%})", "free the GPU "
                         "(a process outside this container?) or name other GPUs in "
                         "engine.gpus", transient=True)
    return _ok("GPUs", f"GPUs {names}: idle, >= {MIN_FREE:.0%} memory free")


def _smi(smi: str, args: tuple[str, ...]) -> list[list[str]]:
    try:
        p = subprocess.run([smi, *args], capture_output=True, text=True,
                           timeout=SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(str(exc)) from exc
    if p.returncode != 0:
        raise RuntimeError((p.stderr or p.stdout).strip()[-200:] or f"exit {p.returncode}")
    return [[f.strip() for f in line.split(",")] for line in p.stdout.splitlines()
            if line.strip() and "No running" not in line]


# -- ports -------------------------------------------------------------------------------------


def fixed_ports(cfg: EngineConfig) -> list[tuple[str, int]]:
    """(label, port) for every port the profile fixes: each process's, the PD bootstrap port."""
    out = [(p.role, p.port) for p in cfg.processes if p.port is not None]
    for p in cfg.processes:  # the PD bootstrap port is an argument, not a process port
        argv = list(p.argv)
        if "--disaggregation-bootstrap-port" in argv:
            value = argv[argv.index("--disaggregation-bootstrap-port") + 1]
            if value.isdigit():  # else `{port:bootstrap}`: chosen free at launch
                out.append((f"{p.role} bootstrap", int(value)))
    return out


def port_check(host: str, ports: list[tuple[str, int]]) -> Finding:
    if not ports:
        return Finding("ports", "skip", "no fixed port (ports are chosen free at launch)")
    if not portcheck.is_local_host(host):
        return Finding("ports", "skip", f"{host} is not this machine: its ports are not ours "
                       "to check")
    held = portcheck.first_held(host, ports)
    if held is not None:
        label, holder = held
        return _fail("ports", f"`{label}`: {holder.describe()} on {host}",
                     "stop that process, or set engine.port to a free port (or leave it "
                     "automatic)", transient=True)
    return _ok("ports", ", ".join(f"{port} ({label})" for label, port in ports) + " free")


# -- doctor's own checks ----------------------------------------------------------------------

SM120_ONLY = {"mma-decode": "the SM120 decode entry (flash_mla_with_kvcache_sm120)",
              "triton-indexer": "the SM120 torch indexer (fp8_paged_mqa_logits_torch_sm120)"}


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


def check_entry_point(python: str) -> Finding:
    code, out = _py(python, "from importlib.metadata import entry_points as e; print([x.value "
                            "for x in e(group='sglang.srt.plugins') if x.name=='dsv4bisect'])")
    if code == 0 and "'dsv4bisect.plugin.entry:main'" in out:  # not an older install's value
        return Finding("plugin entry point", "ok", f"{python}: {out}")
    return Finding("plugin entry point", "fail", f"{python}: not registered ({out[-200:]})",
                 "pip install /path/to/dsv4bisect (a checkout of the repository) with the "
                 "engine's Python, the same environment as SGLang")


def target_checks(targets: Mapping[str, Iterable[str]], layout: str,
                  src: SourceTree | None, python: str | None) -> list[Finding]:
    """One row per (patch, target): static when `src` is given, else by import in `python`."""
    table = SIGNATURES[layout]
    rows: list[Finding] = []
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
                rows.append(Finding(name, "ok", "outside SGLang: its SGLang call site is checked"))
                continue
            else:
                found = src.resolve(t)
                why = found if isinstance(found, str) else (
                    sig.mismatch(found.param_names) if sig else "no expected signature")
                how = "AST"
            rows.append(Finding(name, "fail" if why else "ok", f"{how}: {why or 'as expected'}",
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


def contract_checks(patches: Iterable[str], layout: str, src: SourceTree,
                    known: Mapping[str, Patch]) -> list[Finding]:
    """The calls in this layout's SGLang source the patches' hooks rely on
    (`PATCH.sglang.calls`)."""
    rows = []
    for patch in patches:
        for c in known[patch].sglang.calls.get(layout, ()):
            calls = src.calls(c.module, c.callee, within=c.within)
            bad = [] if calls else ["no call site"]
            for call in calls:
                kw = set(call_keywords(call))
                if (kw != c.keywords) if c.exact else not c.keywords <= kw:
                    bad.append(f"keywords {sorted(kw)}")
                if c.index is not None and result_index(call, src.tree(c.module)) != c.index:
                    bad.append(f"result not indexed [{c.index}]")
            rows.append(Finding(f"{patch}: call {c.callee}", "fail" if bad else "ok",
                              f"AST: {'; '.join(bad) or 'as expected'} ({c.why})"))
    return rows


def gpus() -> tuple[list[dict[str, str]], str]:
    """Every GPU nvidia-smi shows (memory with its unit), or none and why (the GPU check's
    own nvidia-smi call)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], "nvidia-smi not found"
    try:
        rows = _smi(smi, ("--query-gpu=index,name,compute_cap,memory.used,memory.total",
                          "--format=csv,noheader"))
    except RuntimeError as exc:
        return [], str(exc)
    keys = ("index", "name", "compute_cap", "memory_used", "memory_total")
    return [dict(zip(keys, r)) for r in rows], ""


def gpu_checks(found: list[dict[str, str]], why: str, patches: Iterable[str]) -> list[Finding]:
    if not found:
        return [Finding("GPUs", "warn", why or "no GPU visible",
                      "run doctor on the GPU node that will serve the model")]
    rows = [Finding("GPUs", "ok", "; ".join(f"{g['index']}: {g['name']} sm_{g['compute_cap']} "
                                        f"({g['memory_used']} / {g['memory_total']})"
                                        for g in found))]
    sm120 = all(g["compute_cap"].startswith("12.") for g in found)
    if not sm120:
        caps = sorted({g["compute_cap"] for g in found})
        for p in patches:
            if p in SM120_ONLY:
                rows.append(Finding(f"{p}: path reached", "fail", f"GPUs sm_{'/'.join(caps)}: "
                                  f"SGLang uses {SM120_ONLY[p]} only on SM120",
                                  f"disable {p} here (its receipts would say never called)"))
    return rows


def port_checks(host: str, ports: Iterable[tuple[str, int]]) -> list[Finding]:
    """Each fixed port free, or the process holding it named (the launcher's own check)."""
    from dsv4bisect.engines.ports import port_holder

    rows = []
    for label, port in ports:
        holder = port_holder(host, port)  # None: free for us to bind
        if holder is None:
            rows.append(Finding(f"port {port} ({label})", "ok", f"{host}:{port} free"))
            continue
        rows.append(Finding(f"port {port} ({label})", "fail", f"{host}:{port}: {holder.describe()}",
                          "stop what holds it or use port: auto"))
    return rows


def all_targets(patches: Iterable[str], layout: str,
                known: Mapping[str, Patch]) -> dict[str, tuple[str, ...]]:
    """patch -> its hook targets and the symbols its hook bodies call, on this layout."""
    out = {p: tuple(known[p].sglang.hooks.get(layout, ())) + known[p].sglang.uses.get(layout, ())
           for p in patches}
    out = {p: ts for p, ts in out.items() if ts}
    out["(contract check)"] = (CONTRACT_TARGET,)
    return out


def forced_flags_check(src: SourceTree | None, version: str | None) -> Finding:
    """What this release sets for DeepSeek-V4 on SM120, read from its own server-args code."""
    if src is None:
        return Finding("SGLang on SM120 (DeepSeek-V4)", "warn", "source not readable here",
                     "give --sglang-src, or run doctor in the engine's Python")
    flags = sm120_forced_flags(src)
    if not flags:
        return Finding("SGLang on SM120 (DeepSeek-V4)", "warn",
                     f"{version}: no DeepSeek-V4 SM120 block found in server args")
    text = ", ".join(f"{f.name}={f.value}{'' if f.forced else ' (if unset)'}" for f in flags)
    return Finding(f"SGLang {version} on SM120 (DeepSeek-V4)", "ok", text,
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
                 allow_unverified: bool = False) -> tuple[Finding, str | None, SglangInfo | None]:
    """The version row and the layout to check targets with. An unverified release is still
    checked statically (with the layout of the range it falls in) so the user sees what
    moved, but the row fails unless `allow_unverified`."""
    if version is None:
        return Finding("SGLang", "fail", f"not installed ({where})",
                     "install SGLang next to dsv4bisect, or give --sglang-src"), None, None
    info = check_version(version, allow_unverified)
    if info.verified:
        if info.layout is None:
            return Finding("SGLang", "fail", f"{version} ({where}): {info.reason}",
                         f"use SGLang {VERIFIED[0]} or newer"), None, info
        return Finding("SGLang", "ok", f"{version} ({where}): verified, hook layout {info.layout}"), \
            info.layout, info
    if info.layout is not None:  # allowed
        return Finding("SGLang", "warn", f"{version} ({where}): unverified; {info.warning}"), \
            info.layout, info
    static = check_version(version, True).layout or LAYOUTS[-1]
    return Finding("SGLang", "fail", f"{version} ({where}): unverified: {info.reason}",
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


def embedded_checks(python: str, checkpoint: str, device: str = "auto") -> list[Finding]:
    """A `kind: reference` profile's engine, in the engine's Python: torch imports there, the
    checkpoint exists and loads (every tensor, strictly, as `serve` loads it), the device asked
    for is there. No SGLang, no GPUs needed."""
    try:
        p = subprocess.run([python, "-c", _EMBEDDED_PROBE, checkpoint], capture_output=True,
                           text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [Finding("engine Python", "fail", f"{python}: {exc}",
                      "set engine.python to an interpreter that has dsv4bisect installed")]
    lines = p.stdout.strip().splitlines()
    try:
        found = json.loads(lines[-1]) if p.returncode == 0 and lines else None
    except ValueError:
        found = None
    if not isinstance(found, dict):
        return [Finding("engine Python", "fail", f"{python}: {(p.stderr or p.stdout)[-200:]}",
                      "install dsv4bisect into the engine's Python")]
    rows = [Finding("engine Python", "ok", f"{python}: runs dsv4bisect")]
    if "torch_error" in found:
        return rows + [Finding("torch", "fail", f"not importable: {found['torch_error']}",
                             "pip install torch==2.13.0 -e '.[engine]' in that Python")]
    rows.append(Finding("torch", "ok", f"{found['torch']}" + (", CUDA available" if found["cuda"]
                                                          else ", CPU only")))
    if device == "cuda" and not found["cuda"]:
        rows.append(Finding("device", "fail", "engine.reference.device is cuda; torch sees no GPU",
                          "set engine.reference.device: auto (or cpu)"))
    if "checkpoint_error" in found:
        rows.append(Finding(f"checkpoint {checkpoint}", "fail", found["checkpoint_error"],
                          "set engine.reference.checkpoint to embedded, random or a "
                          "DeepSeek-format checkpoint directory"))
    else:
        rows.append(Finding(f"checkpoint {checkpoint}", "ok", found["checkpoint"]))
    return rows


# -- doctor shows the preflight ----------------------------------------------------------------

DOCTOR_CHECKS = ("engine Python", "SGLang", "vLLM", "model", "GPUs")  # the rest: doctor's own rows


def doctor_rows(loaded: LoadedProfile, cfg: EngineConfig, python: str | None = None
                ) -> list[Finding]:
    """The preflight's checks that `doctor` has no row of its own for, named `preflight: ...`:
    the engine Python runs, SGLang as pinned and importable, the model, GPUs free."""
    return [replace(f, check=f"preflight: {f.check}") for f in preflight(loaded, cfg, python)
            if f.check in DOCTOR_CHECKS and f.status != "skip"]
