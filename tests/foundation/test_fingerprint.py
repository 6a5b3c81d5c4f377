"""The fingerprint: stable across runs and machines, blind to volatile fields, sensitive to
every effective change."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dsv4bisect.config import fingerprint as fp
from dsv4bisect.config.resolve import Overrides, resolve


def test_stable_across_processes_and_working_directories(tmp_path: Path) -> None:
    code = "from dsv4bisect.config.resolve import resolve; print(resolve('reference-all').fingerprint)"
    outs = {
        subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                       check=True, env={**os.environ, "HOME": str(tmp_path)}).stdout.strip()
        for cwd in (tmp_path, Path.cwd())
    }
    assert outs == {resolve("reference-all").fingerprint}


def test_blind_to_auto_ports_and_fixed_ports() -> None:
    base = resolve("dsv4-flash-tp8").fingerprint
    assert resolve("dsv4-flash-tp8", Overrides(sets=("engine.port=31000",))).fingerprint == base


def test_blind_to_model_path_but_not_to_model_content(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"routed_scaling_factor": 1.5}))
    fa = resolve("dsv4-flash-tp8", Overrides(sets=(f"engine.model={a}",))).fingerprint
    fb = resolve("dsv4-flash-tp8", Overrides(sets=(f"engine.model={b}",))).fingerprint
    assert fa == fb
    (b / "config.json").write_text(json.dumps({"routed_scaling_factor": 2.5}))
    fb2 = resolve("dsv4-flash-tp8", Overrides(sets=(f"engine.model={b}",))).fingerprint
    assert fb2 != fa


def test_changes_with_every_effective_change() -> None:
    base = resolve("reference-all").fingerprint
    variants = [
        Overrides(disable=("mhc-bf16",)),
        Overrides(sets=("patches.mma-decode.variant=split-k-fp32",)),
        Overrides(sets=("engine.chunked_prefill_size=1024",)),
        Overrides(sets=("engine.moe_backend=flashinfer_trtllm",)),
        Overrides(sets=("engine.env.SOME_FLAG=1",)),
        Overrides(sets=("engine.args=[--x]",)),
        Overrides(sets=("engine.reference.checkpoint=/somewhere/else",)),
    ]
    seen = {base}
    for ov in variants:
        f = resolve("reference-all", ov).fingerprint
        assert f not in seen, ov
        seen.add(f)


def test_covers_patch_and_kernel_code(monkeypatch) -> None:
    base = resolve("reference-all").fingerprint
    fp.code_hash.cache_clear()
    monkeypatch.setattr(fp, "code_hash", lambda: "other-code")
    assert resolve("reference-all").fingerprint != base
    monkeypatch.undo()
    monkeypatch.setattr(fp, "reference_engine_version", lambda: "reference-other")
    assert resolve("reference-all").fingerprint != base


def test_probe_settings_are_not_the_experiment() -> None:
    # The probe spec is its own key in the ledger (fingerprint, probe spec, seed block).
    base = resolve("reference-all").fingerprint
    assert resolve("reference-all", Overrides(sets=("probe.tier=ci",))).fingerprint == base


def test_the_cli_only_plugin_checks_are_not_part_of_the_experiment() -> None:
    """doctor's static checks never run in an engine: editing them must not change every
    fingerprint (and throw away every cached baseline)."""
    from dsv4bisect.config import fingerprint as fp

    hashed = {name for name, _ in fp._sources("plugin", "sglang_hooks")}
    assert fp.CLI_ONLY <= hashed  # the names are real files
    assert "plugin/install.py" in hashed and "sglang_hooks/mhc.py" in hashed
