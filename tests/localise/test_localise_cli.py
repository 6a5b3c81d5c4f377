"""`dsv4bisect localise` as a user runs it (the shared `cli` fixture).

The slow tests are the issue's "Done when" on the embedded engine: for every fault that FAILs
in the verdict table, `localise reference --only P --set patches.P.variant=V --json` names the
module or op the fault's code changes; each real patch that drifts alone names its own op; a
patch with no effect and a harmless change name nothing. Each runs one case (the smoke tier's
longest drift transcript, ~2k tokens): 1-3 minutes on the loaded 2-core CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_nothing_to_localise_is_bad_input(cli, tmp_path: Path) -> None:
    proc = cli("localise", "reference", "--out", tmp_path)
    assert proc.returncode == 5, proc.stderr
    assert "error: nothing to localise" in proc.stderr and "hint:" in proc.stderr


def test_an_unknown_revert_and_flags_on_a_bisect_directory_are_bad_input(cli,
                                                                         tmp_path: Path) -> None:
    proc = cli("localise", "reference", "--only", "mhc-bf16", "--revert", "bogus")
    assert proc.returncode == 5 and "--revert bogus" in proc.stderr
    proc = cli("localise", "reference", "--only", "mhc-bf16", "--from", tmp_path / "nowhere")
    assert proc.returncode == 5 and "not a directory" in proc.stderr
    (tmp_path / "bisect.json").write_text("{}")
    proc = cli("localise", tmp_path, "--only", "mhc-bf16")
    assert proc.returncode == 5 and "brings its own ends" in proc.stderr


FAULTS = [  # (patch, variant, module, op, kind)
    ("fp8-wo-a-gemm", "scale-layout", "layers.0.attn", "attn.wo_a", "activation"),
    ("fp8-wo-a-gemm", "scale-truncate", "layers.0.attn", "attn.wo_a", "activation"),
    ("mma-decode", "merge-no-rescale", "layers.3.attn", "attn.sparse_attention.merge",
     "activation"),
    ("mma-decode", "compress-rope-base", "layers.2.attn.compressor", "compressor.entries",
     "activation"),
    ("mma-decode", "batch-kv-slot", "layers.0.attn", "attn.kv_write", "activation"),
    ("mma-decode", "swa-ring-stale", "layers.0.attn", "state.swa_window", "state"),
    ("nextn-speculation", "draft-eos", "speculative", "spec.stop_check", "spec"),
]


def _localise(cli, tmp_path: Path, *args: str) -> tuple[int, dict]:
    proc = cli("localise", *args, "--json", "--out", tmp_path, timeout=1800)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize(("patch", "variant", "module", "op", "kind"), FAULTS,
                         ids=[f[1] for f in FAULTS])
def test_each_failing_fault_names_the_op_its_code_changes(cli, tmp_path: Path, patch: str,
                                                          variant: str, module: str, op: str,
                                                          kind: str) -> None:
    rc, out = _localise(cli, tmp_path, "reference", "--only", patch,
                        "--set", f"patches.{patch}.variant={variant}")
    first = out["first_divergence"]
    assert rc == 0 and first is not None
    assert (first["module"], first["op"], first["kind"]) == (module, op, kind)
    assert first["positions"], first
    if kind != "spec":
        assert first["multiple"] > 1 and (first["inputs_multiple"] or 0) <= 1
    if kind == "state":
        assert out["state"]["first"]["op"] == op
    assert f"{patch}:{variant}" in first["acts_on"]


REAL = [("mhc-bf16", "layers.0", "mhc.pre_attn"),
        ("mma-decode", "layers.0.attn", "attn.sparse_attention"),
        ("triton-indexer", "layers.2.attn.indexer", "indexer.scores"),
        ("fp8-wo-a-gemm", "layers.0.attn", "attn.wo_a")]


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize(("patch", "module", "op"), REAL, ids=[r[0] for r in REAL])
def test_each_real_patch_that_drifts_names_its_own_op(cli, tmp_path: Path, patch: str,
                                                      module: str, op: str) -> None:
    rc, out = _localise(cli, tmp_path, "reference", "--only", patch)
    first = out["first_divergence"]
    assert rc == 0 and (first["module"], first["op"]) == (module, op)
    assert first["multiple"] > 1 and patch in first["acts_on"]


@pytest.mark.slow
@pytest.mark.e2e
def test_hash_topk_scaling_names_its_combine_where_it_moves_anything(cli,
                                                                     tmp_path: Path) -> None:
    """`topk` scales before the combine instead of after it: an fp32 reordering of the hash
    layers' routed output, below the fp32 floor unless it flips a rounding downstream."""
    _, out = _localise(cli, tmp_path, "reference", "--only", "hash-topk-scaling")
    first = out["first_divergence"]
    assert first is None or first["op"] == "moe.combine"


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("args", [("--only", "trtllm-clamp"),
                                  ("--set", "engine.chunked_prefill_size=512")],
                         ids=["no-effect-patch", "harmless-rechunk"])
def test_a_change_that_moves_nothing_names_nothing(cli, tmp_path: Path,
                                                   args: tuple[str, ...]) -> None:
    rc, out = _localise(cli, tmp_path, "reference", *args)
    assert rc == 1 and out["first_divergence"] is None and out["state"]["first"] is None
    assert out["null_arms"], out  # judged against a held-out envelope, not against nothing
