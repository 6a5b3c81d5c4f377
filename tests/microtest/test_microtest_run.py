"""`run_microtest` on the random tiny checkpoint saved to a directory and on the synthetic
checkpoint in the real formats: what passes, what is flagged, what is read, bad input."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dsv4bisect.config.checkpoints import EMBEDDED_CHECKPOINT
from dsv4bisect.errors import ConfigError, PatchError
from dsv4bisect.microtest.activations import capture_activations
from dsv4bisect.microtest.results import MicrotestReport
from dsv4bisect.microtest.run import run_microtest
from dsv4bisect.microtest.spec import MicrotestSpec, parse_patches, resolve_layers
from dsv4bisect.reference.checkpoint import CheckpointReader, random_model
from dsv4bisect.reference.config import ModelArgs

from .conftest import NVFP4_LAYERS, write_synthetic


def run(checkpoint: Path | str, *patches: str, **kw: object) -> MicrotestReport:
    kw.setdefault("contexts", (1024, 4096))
    kw.setdefault("tokens", 16)
    return run_microtest(MicrotestSpec(patches=parse_patches(list(patches)),
                                       checkpoint=str(checkpoint), **kw))


def rows(report: MicrotestReport, patch: str, case: str = "") -> list:
    return [r for r in report.rows if r.patch == patch and case in r.case]


def test_all_six_on_the_saved_random_checkpoint(random_dir: Path) -> None:
    rep = run(random_dir, layers="0,2,3")
    assert rep.patches() == ["mhc-bf16", "hash-topk-scaling", "mma-decode", "triton-indexer",
                             "nvfp4-dispatch", "trtllm-clamp"]
    assert all(r.status == "ok" for r in rows(rep, "mhc-bf16"))
    assert all(1e-4 < r.value < 1e-2 for r in rows(rep, "mhc-bf16", "mixes"))
    splitk = rows(rep, "mma-decode", "bf16 partials")
    assert {r.detail["splits"] for r in splitk} >= {1, 2}  # HCA layer 3 at 1k: 80 keys
    assert all(r.value < 1e-2 for r in splitk)
    assert all(r.value < 1e-5 for r in rows(rep, "mma-decode", "fp32 partials"))
    assert [r.layers for r in rows(rep, "triton-indexer")] == [(2,), (2,)]  # CSA only
    # nvfp4-dispatch is in the set: the higher-precision experts become NVFP4, so marlin (TopK and
    # the runner both scale) fails with rsf² and every other runner applies rsf once
    marlin = rows(rep, "hash-topk-scaling", "marlin")
    assert marlin and all(r.status == "FAIL" and r.detail["factor"] == pytest.approx(2.25)
                          for r in marlin)
    assert all(r.status == "ok" for r in rows(rep, "hash-topk-scaling") if r not in marlin)
    assert rep.exit_code == 1 and {r.patch for r in rep.failed} <= {"hash-topk-scaling",
                                                                       "triton-indexer"}
    clamp = rows(rep, "trtllm-clamp")
    assert all(r.status == "fault" for r in clamp if "ignore-alpha" in r.case)  # not counted
    assert all(r.value < 1e-5 for r in clamp if r.case.startswith("alpha"))
    assert all(0 < r.value < 0.05 for r in clamp if "activity" in r.case)


def test_random_checkpoint_equals_the_saved_one(random_dir: Path) -> None:
    a = run("random", "mhc-bf16", "mma-decode", layers="3")
    b = run(random_dir, "mhc-bf16", "mma-decode", layers="3")
    assert [r.value for r in a.rows] == [r.value for r in b.rows]


def test_scaling_contract_on_the_synthetic_checkpoint(synthetic: tuple[Path, dict]) -> None:
    directory, _ = synthetic
    rep = run(directory, "hash-topk-scaling", layers="all")
    by = {(r.detail["backend"], n): r for r in rep.rows for n in r.layers}
    for layer in NVFP4_LAYERS:  # ModelOpt NVFP4 experts
        assert by["marlin", layer].status == "FAIL"
        assert by["marlin", layer].detail["where"] == "topk+runner"
        assert by["marlin", layer].detail["factor"] == pytest.approx(1.5**2)
        assert by["triton", layer].status == "ok"
        assert by["triton", layer].detail["kernel"] == "cutlass_moe_fp4"
    for layer in (0, 1, 2):  # MXFP4 hash layers: rsf once, at the shared-expert add
        assert all(by[b, layer].status == "ok" for b in ("triton", "marlin"))
    assert rep.exit_code == 1
    only_triton = run(directory, "hash-topk-scaling", layers="all", runners=("triton",))
    assert only_triton.exit_code == 0


def test_dispatch_map_and_nvfp4_error_on_the_synthetic_checkpoint(synthetic) -> None:
    directory, _ = synthetic
    rep = run(directory, "nvfp4-dispatch", layers="2,3")
    maps = rows(rep, "nvfp4-dispatch", "method map")
    assert [r.value for r in maps] == [0.0, 0.0]
    assert "ModelOptNvFp4FusedMoEMethod" in maps[1].note
    weights = rows(rep, "nvfp4-dispatch", "expert weights")
    assert "from mxfp4" in weights[0].case and weights[0].status == "ok"
    assert weights[1].status == "info" and "stored as NVFP4" in weights[1].note


def test_quant_map_that_disagrees_with_the_tensors_fails(tmp_path: Path) -> None:
    write_synthetic(tmp_path, hf_layers=(2, 3, 4, 5))  # layer 2 is listed NVFP4, stored MXFP4
    rep = run(tmp_path, "nvfp4-dispatch", layers="2")
    row = rows(rep, "nvfp4-dispatch", "method map")[0]
    assert row.status == "FAIL" and row.value > 0
    assert "layers.2.ffn.experts.0.w1" in row.note


def test_missing_tensor_is_named(random_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(random_dir, broken)
    name = "layers.2.attn.indexer.wq_b.weight"
    with CheckpointReader(broken) as r:
        keep = {n: r.get(n) for n in r.names() if n != name}
    for f in broken.glob("*.safetensors"):
        f.unlink()
    (broken / "model.safetensors.index.json").unlink()
    save_file(keep, str(broken / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"lacks 1 tensor.*layers\.2\.attn\.indexer\.wq_b"):
        run(broken, "triton-indexer", layers="2")
    assert run(broken, "mhc-bf16", layers="2").exit_code == 0  # other checks do not need it


def test_only_the_chosen_layers_are_read(random_dir: Path, monkeypatch) -> None:
    read: list[str] = []
    original = CheckpointReader.get

    def spy(self: CheckpointReader, name: str) -> torch.Tensor:
        read.append(name)
        return original(self, name)

    monkeypatch.setattr(CheckpointReader, "get", spy)
    rep = run(random_dir, layers="3")
    assert read and all(n.startswith("layers.3.") for n in read)
    assert rep.tensors_read == len(set(read))


def test_fault_variants_are_counted_when_asked_for() -> None:
    rep = run("random", "mma-decode:merge-no-rescale", "trtllm-clamp:ignore-alpha", layers="3")
    fault = rows(rep, "mma-decode", "without rescale")
    assert [r.status for r in fault] == ["FAIL", "FAIL"]
    assert rows(rep, "trtllm-clamp", "ignore-alpha")[0].status == "FAIL"
    double = run("random", "hash-topk-scaling:double-scale", layers="0,3", runners=("triton",))
    by_layer = {r.layers: r for r in double.rows}
    assert by_layer[(0,)].status == "FAIL" and by_layer[(0,)].detail["factor"] == \
        pytest.approx(2.25)  # hash layer: HashTopK and the runner
    assert by_layer[(3,)].status == "ok"


def test_captured_activations(tmp_path: Path) -> None:
    args = ModelArgs.preset("tiny")
    model = random_model(args, 0)
    tokens = torch.randint(0, args.vocab_size, (40,), generator=torch.Generator().manual_seed(5))
    captured = capture_activations(model, tokens)
    assert captured["layers.3.hc_ffn.in"].shape == (40, args.hc_mult, args.hidden_size)
    path = tmp_path / "acts.safetensors"
    save_file(captured, str(path))
    rep = run("random", "mhc-bf16", "hash-topk-scaling", layers="0,3", activations=str(path))
    assert all(r.detail["activations"] == "captured" for r in rows(rep, "mhc-bf16"))
    assert all("tokens captured" in r.detail["activations"]
               for r in rows(rep, "hash-topk-scaling") if 0 in r.layers)
    synthetic = run("random", "mhc-bf16", layers="0")
    assert rows(rep, "mhc-bf16")[0].value != synthetic.rows[0].value
    save_file({"layers.0.attn.in": torch.zeros(4, 7)}, str(path))
    with pytest.raises(ConfigError, match=r"layers\.0\.attn\.in.*shape \(4, 7\)"):
        run("random", "mhc-bf16", layers="0", activations=str(path))


def test_bad_input() -> None:
    with pytest.raises(PatchError, match="mhc-bf17"):
        parse_patches(["mhc-bf17"])
    with pytest.raises(ConfigError, match="out of range"):
        resolve_layers("7", ModelArgs.preset("tiny"))
    assert resolve_layers("auto", ModelArgs.preset("flash")) == (0, 2, 3, 42)
    assert resolve_layers("auto", ModelArgs.preset("tiny")) == (0, 2, 3, 5)
    assert resolve_layers("hca,1", ModelArgs.preset("tiny")) == (1, 3, 5)
    with pytest.raises(ConfigError, match="not installed|no config.json"):
        run("embedded" if not (EMBEDDED_CHECKPOINT / "config.json").is_file() else "/nonexistent",
            "mhc-bf16")


@pytest.mark.skipif(not (EMBEDDED_CHECKPOINT / "config.json").is_file(),
                    reason="the embedded checkpoint is not installed yet")
def test_embedded_checkpoint() -> None:
    rep = run("embedded", "mhc-bf16", "mma-decode", layers="auto")
    assert all(r.status in ("ok", "info") for r in rep.rows)


_INTERPRETED = """
from dsv4bisect.microtest import context
from dsv4bisect.microtest.run import run_microtest
from dsv4bisect.microtest.spec import MicrotestSpec, parse_patches
spec = MicrotestSpec(patches=parse_patches([]), checkpoint="random", layers="2,3",
                     contexts=(1024,), tokens=8)
ref = run_microtest(spec)
context.Context.cuda = property(lambda self: True)  # take the --device cuda branches on CPU
tri = run_microtest(spec)
for a, b in zip(ref.rows, tri.rows, strict=True):
    assert a.status == b.status, (a.patch, a.case)
    if a.metric == "rel_err" and a.value > 1e-4:
        assert abs(b.value - a.value) <= 1e-3 * a.value, (a.patch, a.case, a.value, b.value)
print("rows", len(tri.rows))
"""


@pytest.mark.slow
def test_cuda_code_path_through_the_triton_interpreter() -> None:
    """The `--device cuda` branches (Triton mhc_mixes, split-K attention, indexer logits, NVFP4
    quantiser) run in Triton's CPU interpreter and agree with the PyTorch references (~80 s).
    A fresh process: the interpreter must be on before the first kernel is built."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", _INTERPRETED], env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rows" in done.stdout
