"""The command line as a user runs it: real processes, stdout for results, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

BROKEN = Path(__file__).parents[1] / "data" / "broken"


def test_import_of_cli_loads_no_torch() -> None:
    # `app` builds every command (main imports only the one it runs); loading the registry
    # imports every patch module (their swaps and hooks import torch only when they run)
    code = ("import sys, dsv4bisect.config.resolve; from dsv4bisect.cli import app; "
            "from dsv4bisect.patching.registry import builtin_patches; builtin_patches(); "
            "heavy = [m for m in ('torch', 'triton', 'sglang', 'numpy', 'uvicorn', 'starlette')"
            " if m in sys.modules]; "
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "DSV4BISECT_TEST_PATCHES": "1"})
    assert out.stdout.strip() == "[]"


def test_help_lists_commands(cli) -> None:
    proc = cli("--help")
    assert proc.returncode == 0
    for command in ("patches", "profile", "diff-config"):
        assert command in proc.stdout


def test_resolved_json_has_fingerprint_patches_processes(cli) -> None:
    proc = cli("profile", "show", "dsv4-flash-pd8-all", "--resolved", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert len(data["fingerprint"]) == 16
    assert [p["name"] for p in data["patches"]][:2] == ["mhc-bf16", "hash-topk-scaling"]
    assert [p["role"] for p in data["processes"]] == ["prefill", "decode", "router"]
    for proc_ in data["processes"]:
        assert {"role", "argv", "env"} <= proc_.keys()


def test_show_why_reports_sources_of_values(cli) -> None:
    proc = cli("profile", "show", "reference-all", "--why", "--set", "engine.tp=2")
    assert proc.returncode == 0, proc.stderr
    assert "engine.tp" in proc.stdout and "--set engine.tp=2" in proc.stdout
    assert "builtin:reference-all.yaml:" in proc.stdout


def test_validate_broken_profile_is_one_line_error_and_exit_5(cli) -> None:
    proc = cli("profile", "validate", str(BROKEN / "unknown_key.yaml"))
    assert proc.returncode == 5
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("error: ") and ":8:3: " in lines[0]
    assert lines[1].startswith("hint: ") and len(lines) == 2
    assert "Traceback" not in proc.stderr


def test_unknown_patch_flag_exit_5(cli) -> None:
    proc = cli("profile", "show", "reference", "--enable", "mma-decod")
    assert proc.returncode == 5
    assert "did you mean `mma-decode`" in proc.stderr


def test_profile_new_writes_a_starter_that_validates(cli, tmp_path: Path) -> None:
    proc = cli("profile", "new", "mine", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "mine.yaml").read_text()
    assert "# " in text and "mma-decode: false" in text
    assert cli("profile", "validate", "mine.yaml", cwd=tmp_path).returncode == 0
    proc = cli("profile", "new", "child", "--from", "reference-all", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert cli("profile", "validate", "child.yaml", cwd=tmp_path).returncode == 0
    assert cli("profile", "new", "mine", cwd=tmp_path).returncode == 5  # no overwrite


def test_schema_is_json_schema_with_strict_objects(cli) -> None:
    proc = cli("profile", "schema")
    schema = json.loads(proc.stdout)
    assert schema["title"] == "dsv4bisect profile"
    assert schema["additionalProperties"] is False
    assert "engine" in schema["properties"]


def test_patches_list_and_show(cli) -> None:
    listing = cli("patches", "list", "--json")
    names = [row["name"] for row in json.loads(listing.stdout)]
    assert names[:6] == ["mhc-bf16", "hash-topk-scaling", "mma-decode", "triton-indexer",
                         "nvfp4-dispatch", "trtllm-clamp"] and len(names) == 13
    assert names[-1] == "nextn-speculation"
    shown = cli("patches", "show", "trtllm-clamp")
    assert shown.returncode == 0 and "ignore-alpha (FAULT)" in shown.stdout
    under = json.loads(cli("patches", "list", "--profile", "reference-all", "--json").stdout)
    clamp = next(r for r in under if r["name"] == "trtllm-clamp")
    assert clamp["enabled"] and clamp["inert"]


def test_fp8_wo_a_gemm_is_listed_modelled_off_everywhere_and_with_its_field_faults(cli) -> None:
    from dsv4bisect.config.layering import builtin_dir

    row = next(r for r in json.loads(cli("patches", "list", "--json").stdout)
               if r["name"] == "fp8-wo-a-gemm")
    assert row["faults"] == ["scale-layout", "scale-truncate"]
    assert set(row["citations"]) == {"scale-layout", "scale-truncate"}
    shown = cli("patches", "show", "fp8-wo-a-gemm")
    assert "scale-layout (FAULT)" in shown.stdout and "sglang#29038" in shown.stdout
    assert "not modelled" not in shown.stdout
    # off in every shipped embedded-engine profile: reference-all's default run stays the six
    # real patches (the SGLang `-all` profiles turn on every switch their release has)
    for name in ("reference", "reference-all"):
        doc = yaml.safe_load((builtin_dir() / f"{name}.yaml").read_text())
        assert "fp8-wo-a-gemm" not in (doc.get("patches") or {}), name
    under = json.loads(cli("patches", "list", "--profile", "reference-all", "--set",
                           "patches.fp8-wo-a-gemm.variant=scale-layout", "--json").stdout)
    wo_a = next(r for r in under if r["name"] == "fp8-wo-a-gemm")
    assert wo_a["enabled"] and wo_a["variant"] == "scale-layout" and not wo_a["inert"]


def test_shipped_profiles_are_plain_yaml_with_comments() -> None:
    from dsv4bisect.config.layering import builtin_dir

    for path in builtin_dir().glob("*.yaml"):
        text = path.read_text()
        assert text.lstrip().startswith("#"), path
        yaml.safe_load(text)
