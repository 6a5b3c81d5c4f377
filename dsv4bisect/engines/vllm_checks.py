"""The vLLM node's checks, before a launch (preflight) and in `dsv4bisect doctor`: the same
`Finding` rows as SGLang's (`engines/preflight.py`).

Preflight (`run` / `bisect` of a `kind: vllm` profile): the engine's Python runs; vLLM is
installed there at a verified release (0.20.0–0.34.0, or allowed by
`engine.allow_unverified_vllm`) equal to the profile's `engine.vllm_version`; the plugin's
entry point (`dsv4bisect` in `vllm.general_plugins`) is registered there and not excluded by
the profile's `VLLM_PLUGINS`; the command line parses as that release's `vllm serve`
(`plugin/vllm/argcheck.py` over the shipped facts). Model, GPUs and ports are SGLang's checks.

Doctor adds, per delivered patch, every hook target and every symbol its body calls: by import
in the engine's Python when vLLM is installed there (what the plugin itself will do), else
against the release's source facts (shipped for the verified releases, or extracted from
`--vllm-src WHEEL|DIR`): the symbol exists with the expected signature, each declared by-value
copy is imported where the hook rebinds it, and the call sites the hooks rely on pass the
expected keywords. What it cannot check here says so (status `warn`, what would settle it).
Pure functions returning Findings; no Typer, no Rich, no torch, no vLLM import in this process.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from dsv4bisect.base import vllm_releases as vr
from dsv4bisect.config.engine_config import EngineConfig
from dsv4bisect.engines.finding import Finding
from dsv4bisect.plugin.vllm import declared as decl
from dsv4bisect.plugin.vllm.argcheck import check_argv
from dsv4bisect.vllm_hooks import targets as tg

GROUP = "vllm.general_plugins"
ENTRY = "dsv4bisect.plugin.vllm:main"
PY_TIMEOUT_S = 120.0

_PROBE = """\
import json, sys
out = {"python_version": sys.version.split()[0], "vllm": None, "entry": []}
try:
    import importlib.metadata as m
    out["vllm"] = m.version("vllm")
except Exception:
    pass
try:
    from importlib.metadata import entry_points
    out["entry"] = [e.value for e in entry_points(group=%r) if e.name == "dsv4bisect"]
except Exception as exc:
    out["entry_error"] = repr(exc)[-200:]
print(json.dumps(out))
""" % GROUP


def probe_python(python: str) -> dict[str, Any] | str:
    """The engine Python's vLLM version and dsv4bisect entry points, or why it did not run."""
    exe = shutil.which(python) or python
    if shutil.which(python) is None and not Path(python).is_file():
        return f"engine Python `{python}` not found (PATH or file)"
    try:
        p = subprocess.run([exe, "-c", _PROBE], capture_output=True, text=True,
                           timeout=PY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"engine Python {exe} does not run: {exc}"
    try:
        return dict(json.loads(p.stdout.strip().splitlines()[-1]), python=exe)
    except (ValueError, IndexError):
        said = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1][:200]
        return f"engine Python {exe} does not run: {said}"


def release_row(version: str | None, where: str, allow: bool
                ) -> tuple[Finding, vr.VllmInfo | None]:
    """The vLLM row and its verdict (layout None: refused)."""
    if version is None:
        return Finding("vLLM", "fail", f"vLLM is not installed in {where}",
                        "install vLLM in the engine's Python or set engine.python to the one "
                        "that has it (doctor: or give --vllm-src)"), None
    info = vr.check_version(version, allow or vr.allowed_by_env())
    if info.layout is None:
        return Finding("vLLM", "fail", f"{version} ({where}): {info.reason}",
                        vr.refusal_hint(info)), info
    if not info.verified:
        return Finding("vLLM", "warn", f"{version} ({where}): {info.warning}"), info
    return Finding("vLLM", "ok", f"{version} ({where}): verified, hook layout {info.layout}"), \
        info


def entry_row(found: Mapping[str, Any], env: Mapping[str, str]) -> Finding:
    """The plugin registered in the engine's Python and allowed by VLLM_PLUGINS."""
    where = found.get("python", "?")
    if ENTRY not in found.get("entry", []):
        return Finding("plugin", "fail", f"{where}: no entry point dsv4bisect in {GROUP} "
                        f"({found.get('entry') or found.get('entry_error') or 'none'})",
                        "pip install /path/to/dsv4bisect with the engine's Python (the same "
                        "environment as vLLM)")
    allow = env.get("VLLM_PLUGINS")
    if allow is not None and "dsv4bisect" not in allow.split(","):
        return Finding("plugin", "fail", f"VLLM_PLUGINS={allow} excludes dsv4bisect",
                        "add dsv4bisect to VLLM_PLUGINS (the launcher does when it sets it)")
    how = "VLLM_PLUGINS unset: every installed plugin loads" if allow is None else \
        f"VLLM_PLUGINS={allow}"
    return Finding("plugin", "ok", f"{where}: {ENTRY} ({how})")


def argv_row(cfg: EngineConfig, facts: Mapping[str, Any], release: str) -> Finding:
    """The server's command line against the release's own `vllm serve` options."""
    proc = next(p for p in cfg.processes if p.gets_patches)
    argv = cfg.materialize({proc.role: proc.port or 8000}, "python3")[0].argv
    problems = check_argv(argv, dict(facts))
    if problems:
        return Finding("vllm serve argv", "fail", f"{release}: " + "; ".join(problems),
                        "fix engine.args (or pin the release they were written for: "
                        "engine.vllm_version)")
    return Finding("vllm serve argv", "ok", f"parses as vllm serve {release} "
                    f"({len([a for a in argv if a.startswith('-')])} options)")


def preflight_rows(cfg: EngineConfig, python: str, pin: str | None,
                   allow: bool) -> list[Finding]:
    """Engine Python, vLLM as pinned and verified, plugin registered, argv parses."""
    found = probe_python(python)
    if isinstance(found, str):
        return [Finding("engine Python", "fail", found,
                         "set engine.python to the interpreter of the vLLM environment")]
    out = [Finding("engine Python", "ok", f"{found['python']}: Python "
                    f"{found['python_version']}")]
    version = found.get("vllm")
    row, info = release_row(version, str(found["python"]), allow)
    if row.status == "fail":
        return out + [row]
    if pin is not None and version is not None and pin.strip() != version.strip():
        return out + [Finding("vLLM", "fail", f"vLLM {version} is installed in "
                               f"{found['python']} but the profile pins engine.vllm_version "
                               f"{pin}", f"pip install vllm=={pin} there, or pin the release "
                               f"you run: --set engine.vllm_version={version}")]
    out += [row, entry_row(found, cfg.processes[0].env_dict())]
    if info is not None and version in vr.shipped_facts():
        out.append(argv_row(cfg, vr.load_facts(version), version))
    return out


# -- doctor: the hook targets -----------------------------------------------------------------
def declared(patches: Iterable[str], layout: str) -> dict[str, tuple[str, ...]]:
    """patch -> its hook targets and the symbols its hook bodies call, on this layout; plus
    the worker entry the plugin wraps and the step whose end flushes the call evidence."""
    out = {p: decl.targets(p, layout) for p in patches}
    out = {p: ts for p, ts in out.items() if ts}
    if out:
        out["(plugin)"] = (tg.WORKER, tg.WORKER_WARMUP, tg.WORKER_STEP)
    return out


def static_target_rows(targets: Mapping[str, tuple[str, ...]], layout: str,
                       facts: Mapping[str, Any], origin: str) -> list[Finding]:
    """Each target against the release's facts: exists, signature, by-value copies."""
    rows = []
    table = tg.SIGNATURES[layout]
    symbols, by_value = facts["symbols"], facts["by_value"]
    for patch, names in targets.items():
        for t in names:
            fact = symbols.get(tg.DEFINED_AT.get(t, t))
            sig = table.get(t)
            label = f"{patch}: {t.rsplit('.', 2)[-2]}.{t.rsplit('.', 1)[-1]}"
            if fact is None:
                why = f"not defined in this release ({t})"
            elif sig is None:
                why = "no expected signature for this layout"
            else:
                why = sig.mismatch(tuple(fact["params"])) if sig.params else None
            site = next((s for s in decl.sites(patch, layout) if s.target == t), None)
            if why is None and site is not None and site.copies:
                have = set(by_value.get(t, {}))
                missing = [m for m in site.copies if m not in have]
                why = f"no by-value copy in {', '.join(missing)}" if missing else None
            rows.append(Finding(label, "fail" if why else "ok",
                                 f"{origin}: {why or 'as expected'}",
                                 "" if not why else "this vLLM moved the target: use a "
                                 f"verified release ({', '.join(vr.VERIFIED)}) or update "
                                 "dsv4bisect"))
    return rows


def contract_rows(patches: Iterable[str], layout: str, facts: Mapping[str, Any],
                  origin: str) -> list[Finding]:
    rows = []
    calls = facts["calls"].get(layout, {})
    # in registry order (the target rows' order too)
    for patch, contracts in decl.call_contracts(layout, patches).items():
        for c, found in zip(contracts, calls.get(patch, [])):
            bad = [] if found["calls"] else ["no call site"]
            for call in found["calls"]:
                if not c.keywords <= set(call["keywords"]):
                    bad.append(f"keywords {call['keywords']}")
                if c.keywords_only and call["positional"]:
                    bad.append(f"{call['positional']} positional arguments")
            rows.append(Finding(f"{patch}: call {c.callee}", "fail" if bad else "ok",
                                 f"{origin}: {'; '.join(bad) or 'as expected'} ({c.why})"))
    return rows


def runtime_target_rows(targets: Mapping[str, tuple[str, ...]], layout: str,
                        python: str) -> list[Finding]:
    """Each target by import in the engine's Python (what the plugin does in a worker)."""
    names = [t for ts in targets.values() for t in ts]
    code = ("import json; from dsv4bisect.plugin.vllm.install import check_targets; "
            f"print(json.dumps({{t: check_targets([t], {layout!r}) for t in {names!r}}}))")
    try:
        p = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=600)
        got = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        got, p = None, exc  # type: ignore[assignment]
    rows = []
    for patch, ts in targets.items():
        for t in ts:
            why = (got or {}).get(t, f"import check failed: {str(getattr(p, 'stderr', p))[-300:]}"
                                  if got is None else "not checked")
            rows.append(Finding(f"{patch}: {t.rsplit('.', 2)[-2]}.{t.rsplit('.', 1)[-1]}",
                                 "fail" if why else "ok", f"import: {why or 'as expected'}"))
    return rows


def gpu_rows(found: list[dict[str, str]], why: str, patches: Iterable[str]) -> list[Finding]:
    if not found:
        return [Finding("GPUs", "warn", why or "no GPU visible",
                         "run doctor on the GPU node that will serve the model")]
    rows = [Finding("GPUs", "ok", "; ".join(f"{g['index']}: {g['name']} sm_{g['compute_cap']}"
                                             for g in found))]
    if "mma-decode" in patches and all(g["compute_cap"].startswith("12.") for g in found):
        rows.append(Finding("mma-decode: path reached", "fail", "vLLM decodes DeepSeek-V4 "
                             "with FlashInfer's sparse MLA on SM12x, not FlashMLA",
                             "disable mma-decode here (its receipts would say never called)"))
    return rows


NOT_HERE = (
    ("hook numerics vs vLLM's own kernels", "the hooks' torch paths against vLLM's mHC "
     "torch.py and routing fallback run on a GPU: tests/vllm/gpu_vllm_check.py "
     "(docs/vllm.md)"),
    ("call evidence", "whether each hook is reached shows only in a real launch's receipts "
     "(written after vLLM's warm-up and every engine step)"),
)


def not_checked_rows() -> list[Finding]:
    return [Finding(name, "warn", f"not checked by doctor: {why}") for name, why in NOT_HERE]


def doctor(cfg: EngineConfig, python: str, pin: str | None, allow: bool,
           src: str | None = None) -> tuple[list[Finding], vr.VllmInfo | None]:
    """doctor's vLLM rows for a `kind: vllm` configuration (not the preflight's model / GPU /
    port rows, which doctor adds itself), and the release verdict."""
    patches = [p.name for p in cfg.patches if p.builtin and p.delivered]
    rows: list[Finding] = []
    found = probe_python(python)
    engine_py = None if isinstance(found, str) else str(found["python"])
    installed = None if isinstance(found, str) else found.get("vllm")
    facts: Mapping[str, Any] | None = None
    if src is not None:
        from dsv4bisect.plugin.vllm.facts import extract
        from dsv4bisect.plugin.vllm.tree import open_tree

        tree = open_tree(src)
        facts = extract(tree)
        version, where, origin = facts["release"], src, f"AST of {Path(src).name}"
    elif installed is not None and engine_py is not None:
        version, where, origin = installed, engine_py, "shipped facts"
    else:
        version, where, origin = pin, "the profile's engine.vllm_version", "shipped facts"
        rows.append(Finding("vLLM installed", "warn", (found if isinstance(found, str) else
                            f"not installed in {found['python']}") + "; checked against the "
                            f"shipped facts of the pinned release", "run doctor in the "
                            "engine's environment on the GPU node for the import checks"))
    row, info = release_row(version, where, allow)
    rows.append(row)
    if not isinstance(found, str):
        rows.append(entry_row(found, cfg.processes[0].env_dict()))
    if info is None or info.layout is None:
        return rows, info
    if facts is None and version in vr.shipped_facts():
        facts = vr.load_facts(version)  # type: ignore[arg-type]
    targets = declared(patches, info.layout)
    if facts is None:
        rows.append(Finding("source facts", "warn", f"none ship for {version}: argv, targets "
                            "and call sites not checked statically", "give --vllm-src WHEEL"))
    else:
        rows.append(argv_row(cfg, facts, str(version)))
        if installed is None or src is not None:
            rows += static_target_rows(targets, info.layout, facts, origin)
        rows += contract_rows(patches, info.layout, facts, origin)
    if installed is not None and src is None and engine_py is not None:
        rows += runtime_target_rows(targets, info.layout, engine_py)
    if not patches:
        rows.append(Finding("hook targets", "ok", "no patch is delivered to vLLM: nothing to "
                            "hook"))
    return rows + not_checked_rows(), info
