"""Preflight: what would stop an SGLang launch, found in seconds instead of after one.

`run` and `bisect` (not `--plan`, not `--test-cmd`) call `require(profile, overrides)` before
anything is launched; `doctor PROFILE` shows the same checks as rows (`doctor_rows`).
`--skip-preflight` skips it. Checks, in order (docs/run.md, "Preflight"):

1. **engine Python**: the interpreter the profile launches (`engine.python`, default `python3`
   on PATH) runs;
2. **SGLang**: installed there, at a verified release (`base.versions.check_version`; an
   unverified one only with `engine.allow_unverified_sglang` or
   `DSV4BISECT_ALLOW_UNVERIFIED_SGLANG=1`), equal to the profile's `engine.sglang_version` pin,
   and `import sglang` succeeds there;
3. **plugin**: the `dsv4bisect` entry point is registered in that Python
   (`engines.doctor.check_entry_point`, the row `doctor` shows);
4. **model**: `engine.model` is a directory with a `config.json` whose `architectures` name
   DeepSeek-V4 (`DeepseekV4ForCausalLM`) and whose quantization matches `engine.expert_quant`;
5. **GPUs**: every GPU the profile names is visible (`nvidia-smi --query-gpu=...`), runs no
   compute process (`--query-compute-apps=...`) and has >= 90 % of its memory free;
6. **ports**: every fixed port (the processes' `port`, the PD bootstrap port) is free, else its
   holder is named (`engines.ports.port_holder`: the launcher's own check).

Embedded (`kind: reference`) and `kind: command` profiles get the port check only. A failure
is one `error:` line and a `hint:`: `ConfigError` (exit 5) for a setup to fix, `EngineError`
(exit 125) for something transient (a port or a GPU someone else is using). Pure functions
returning `Finding`s; no Typer, no Rich, no torch.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsv4bisect.base.bounded import load_json
from dsv4bisect.config.checkpoints import CONFIG_NAME, load_checkpoint_config
from dsv4bisect.config.engine_config import EngineConfig
from dsv4bisect.config.resolve import LoadedProfile, Overrides, load_profile, resolve_loaded
from dsv4bisect.engines import ports as portcheck
from dsv4bisect.errors import ConfigError, Dsv4BisectError, EngineError

DSV4_ARCHITECTURES = ("DeepseekV4ForCausalLM",)
MIN_FREE = 0.90  # of each named GPU's memory
SKIP_HINT = "or pass --skip-preflight if you know better"
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


@dataclass(frozen=True)
class Finding:
    """One check. `status`: ok | fail | skip. A failure is transient (exit 125) when someone
    else holds what we need (a port, a GPU); otherwise it is a setup to fix (exit 5)."""

    check: str
    status: str
    detail: str
    hint: str = ""
    transient: bool = False

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    def error(self) -> Dsv4BisectError:
        hint = f"{self.hint} ({SKIP_HINT})" if self.hint else SKIP_HINT
        cls = EngineError if self.transient else ConfigError
        return cls(f"preflight: {self.detail}", hint)


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
    from dsv4bisect.base.versions import (
        FIRST_SUPPORTED,
        NEWEST_VERIFIED,
        VERIFIED,
        allowed_by_env,
        check_version,
    )
    from dsv4bisect.engines.doctor import check_entry_point

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
            out.append((f"{p.role} bootstrap",
                        int(argv[argv.index("--disaggregation-bootstrap-port") + 1])))
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


# -- doctor ------------------------------------------------------------------------------------

DOCTOR_CHECKS = ("engine Python", "SGLang", "model", "GPUs")  # the rest are doctor's own rows


def doctor_rows(loaded: LoadedProfile, cfg: EngineConfig, python: str | None = None
                ) -> list[Any]:
    """The preflight's checks that `doctor` has no row for, as doctor rows (`engines.doctor.
    Check`): the engine Python runs, SGLang as pinned and importable, the model, GPUs free."""
    from dsv4bisect.engines.doctor import FAIL, OK, Check

    status = {"ok": OK, "fail": FAIL}
    return [Check(f"preflight: {f.check}", status[f.status], f.detail, f.hint)
            for f in preflight(loaded, cfg, python)
            if f.check in DOCTOR_CHECKS and f.status != "skip"]
