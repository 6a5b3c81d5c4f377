"""Checkpoints for the micro-test tests: the random tiny model saved as a directory, and a
synthetic directory in the real stored formats (FP8 block-scaled dense weights with UE8M0 and
fp32 scales, MXFP4 routed experts on layers 0-2 and the MTP layer, ModelOpt NVFP4 experts on
layers 3-5, several shards and an index, `quantization_config` and `hf_quant_config.json`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dsv4bisect.reference.checkpoint import random_model, save_checkpoint, state_tensors
from dsv4bisect.reference.config import ModelArgs
from dsv4bisect.reference.quant_formats import encode

NVFP4_LAYERS = (3, 4, 5)
_DENSE = ("wq_a.weight", "wq_b.weight", "wkv.weight", "wo_a.weight", "wo_b.weight")
QUANTIZATION_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                       "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
_HF = {"model.layers.N.mlp.experts.E.gate_proj": "w1", "model.layers.N.mlp.experts.E.up_proj":
       "w3", "model.layers.N.mlp.experts.E.down_proj": "w2"}


def stored_format_for(name: str) -> str:
    """The format the synthetic checkpoint stores tensor `name` in."""
    if ".experts." in name and ".shared_experts." not in name:
        layer = int(name.split(".")[1]) if name.startswith("layers.") else None
        return "nvfp4" if layer in NVFP4_LAYERS else "mxfp4"
    if name.endswith(_DENSE) and ".compressor." not in name and ".indexer." not in name:
        return "fp8-block-fp32" if name.endswith("wq_b.weight") else "fp8-block"
    if ".shared_experts." in name:
        return "fp8-block"
    if name.endswith(".weight") and (".compressor." in name or ".indexer." in name):
        return "bf16"
    return "as-is"


def hf_quant_config(args: ModelArgs, layers: tuple[int, ...] = NVFP4_LAYERS) -> dict:
    """ModelOpt MIXED_PRECISION: the experts of `layers` are NVFP4 (Hugging Face names)."""
    quantized = {}
    for layer in layers:
        for e in range(args.n_routed_experts):
            for pattern in _HF:
                name = pattern.replace("N", str(layer)).replace("E", str(e))
                quantized[name] = {"quant_algo": "NVFP4", "group_size": 16}
    return {"producer": {"name": "modelopt", "version": "test"},
            "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None,
                             "quantized_layers": quantized}}


def write_synthetic(directory: Path, seed: int = 3,
                    hf_layers: tuple[int, ...] = NVFP4_LAYERS) -> dict[str, torch.Tensor]:
    """Write the synthetic quantised checkpoint; returns the original fp32 tensors."""
    args = ModelArgs.preset("tiny")
    originals = state_tensors(random_model(args, seed))
    stored: dict[str, torch.Tensor] = {}
    for name, t in originals.items():
        fmt = stored_format_for(name)
        stored.update({name: t} if fmt == "as-is" else encode(name, t, fmt))
    save_checkpoint(directory, args, stored, max_shard_bytes=1 << 20)
    cfg = json.loads((directory / "config.json").read_text())
    cfg["quantization_config"] = QUANTIZATION_CONFIG
    cfg["expert_dtype"] = "fp4"
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
    (directory / "hf_quant_config.json").write_text(json.dumps(hf_quant_config(args, hf_layers)))
    return originals


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    directory = tmp_path_factory.mktemp("synthetic-ckpt")
    return directory, write_synthetic(directory)


@pytest.fixture(scope="session")
def random_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The random tiny model (seed 0, as `--checkpoint random`) saved as a directory."""
    directory = tmp_path_factory.mktemp("random-ckpt")
    args = ModelArgs.preset("tiny")
    save_checkpoint(directory, args, state_tensors(random_model(args, 0)), max_shard_bytes=1 << 20)
    return directory


def write_flash_slice(directory: Path, layers: tuple[int, ...] = (2, 3),
                      experts: tuple[int, ...] = (0, 85, 170, 255)) -> None:
    """Layers of DeepSeek-V4-Flash at full size (random weights, seed 1) stored as the NVFP4
    checkpoint stores them: FP8 block-scaled attention and shared expert, bf16 compressor and
    indexer, ModelOpt NVFP4 routed experts (only `experts` of 256), a quant config naming them."""
    from dsv4bisect.reference.checkpoint import init_module
    from dsv4bisect.reference.model import build_block

    flash = ModelArgs.preset("flash")
    stored: dict[str, torch.Tensor] = {}
    for layer in layers:
        block = build_block(flash, layer, expert_ids=experts)
        init_module(block, flash, seed=1, prefix=f"layers.{layer}.")
        for name, t in state_tensors(block, prefix=f"layers.{layer}.").items():
            fmt = "nvfp4" if ".experts." in name and ".shared_" not in name else \
                stored_format_for(name).replace("-fp32", "")
            stored.update({name: t} if fmt == "as-is" else encode(name, t, fmt))
        del block
    save_checkpoint(directory, flash, stored, max_shard_bytes=256 << 20)
    hf = {"quantization": {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None,
                           "exclude_modules": ["lm_head", "model.layers.*.self_attn*",
                                               "model.layers.*.mlp.shared_experts*",
                                               "model.layers.*.mlp.gate"]}}
    (directory / "hf_quant_config.json").write_text(json.dumps(hf))
