"""Write a trained bf16 checkpoint in the seed deployment's format (the shipped checkpoint).

    python tests/benchmarks/export_deployment_checkpoint.py SRC_DIR OUT_DIR [--calib 8]

`nvidia/DeepSeek-V4-Flash-NVFP4`'s layout, at the tiny model's shapes:
- routed experts `layers.N.ffn.experts.E.{w1,w2,w3}` in ModelOpt NVFP4: uint8 E2M1 codes
  `.weight` [R, C/2], float8_e4m3fn `.weight_scale` [R, C/16], fp32 `.weight_scale_2` (global
  amax / (6·448)) and fp32 `.input_scale` (the calibrated activation amax / (6·448): the max
  over the calibration tokens routed to the expert of its GEMM input, w1/w3 share gemm 1's);
- the attention's projections (`wq_a`, `wq_b`, `wkv`, `wo_a`, `wo_b`) and the shared experts in
  DeepSeek's block FP8: float8_e4m3fn with a UE8M0 `.scale` per 128 x 128 block;
- everything else (compressor, indexer, embed, head, norms, mHC, router) as the source stores it
  (bf16);
- `config.json` with DeepSeek's FP8 `quantization_config` and `hf_quant_config.json` (ModelOpt
  `quant_algo: NVFP4`, exclusion globs for the FP8 and bf16 modules), so the checkpoint goes
  through the same reader path as the real one.

The calibration runs the bf16 model in fp32 (`precision: exact`) over `--calib` training
conversations (`reference/training/data.py`, the training vocabulary, never the probe's).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch

from dsv4bisect.reference import model as model_mod
from dsv4bisect.reference.checkpoint import CheckpointReader, load_model, save_checkpoint
from dsv4bisect.reference.config import Numerics
from dsv4bisect.reference.model import is_fp8_module
from dsv4bisect.reference.quant_formats import E4M3_MAX, encode
from dsv4bisect.reference.training.data import sample

E2M1_MAX = 6.0
CALIB_SEED = 20261201
CALIB_TOKENS = 2048
QUANTIZATION_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                       "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
HF_QUANT_CONFIG = {
    "producer": {"name": "modelopt", "version": "dsv4bisect-export"},
    "quantization": {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None,
                     "exclude_modules": ["lm_head", "model.embed_tokens",
                                         "model.layers.*.self_attn*",
                                         "model.layers.*.mlp.shared_experts*",
                                         "model.layers.*.mlp.gate", "mtp*"]},
}


def calibrate(src: Path, n: int) -> dict[str, float]:
    """Per routed expert weight name -> amax of its GEMM input over the calibration tokens."""
    model = load_model(src)
    model.configure(Numerics())
    amax: dict[str, float] = {}
    original = model_mod.MoE._expert

    def recording(self: model_mod.MoE, e: int, xe: torch.Tensor, clamp: str,
                  act_quant: bool) -> torch.Tensor:
        ex = self.experts[str(e)]
        gate, up = xe @ ex.w1.weight.T, xe @ ex.w3.weight.T
        h = model_mod.swiglu(gate, up, self.a.swiglu_limit)
        prefix = f"layers.{self.layer_id}.ffn.experts.{e}."
        for leaf, x in (("w1", xe), ("w3", xe), ("w2", h)):
            key = prefix + leaf + ".weight"
            amax[key] = max(amax.get(key, 0.0), float(x.abs().max()))
        return original(self, e, xe, clamp, act_quant)

    model_mod.MoE._expert = recording  # type: ignore[method-assign]
    try:
        rng = random.Random(CALIB_SEED)
        with torch.inference_mode():
            for _ in range(n):
                ids = sample(rng, CALIB_TOKENS).ids
                model(torch.tensor(ids))
    finally:
        model_mod.MoE._expert = original  # type: ignore[method-assign]
    return amax


def export(src: Path, out: Path, calib: int) -> None:
    amax = calibrate(src, calib)
    reader = CheckpointReader(src)
    args = reader.config
    stored: dict[str, torch.Tensor] = {}
    for name in reader.names():
        module = name.removesuffix(".weight")
        routed = ".ffn.experts." in name and name.endswith(".weight")
        if routed:
            w = reader.get_weight(name)
            stored.update(encode(name, w, "nvfp4"))
            # an expert no calibration token reached keeps the mean of its layer's scales
            stored[module + ".input_scale"] = torch.tensor(
                amax.get(name, _layer_mean(amax, name)) / (E2M1_MAX * E4M3_MAX))
        elif name.endswith(".weight") and is_fp8_module(module):
            stored.update(encode(name, reader.get_weight(name), "fp8-block"))
        else:
            stored[name] = reader.get(name)
    save_checkpoint(out, args, stored, max_shard_bytes=8 << 20)
    cfg = json.loads((out / "config.json").read_text())
    cfg["torch_dtype"] = "bfloat16"
    cfg["quantization_config"] = QUANTIZATION_CONFIG
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "hf_quant_config.json").write_text(json.dumps(HF_QUANT_CONFIG, indent=2) + "\n")
    reached = sum(1 for n in reader.names() if n in amax)
    print(f"wrote {out}: {len(stored)} tensors; {reached} expert weights calibrated",
          file=sys.stderr)


def _layer_mean(amax: dict[str, float], name: str) -> float:
    prefix, leaf = name.split(".experts.")[0], name.rsplit(".", 2)[-2]
    vals = [v for k, v in amax.items() if k.startswith(prefix + ".") and k.endswith(leaf + ".weight")]
    return sum(vals) / len(vals) if vals else 1.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path, help="a bf16 checkpoint directory")
    ap.add_argument("out", type=Path)
    ap.add_argument("--calib", type=int, default=8, help="calibration conversations")
    a = ap.parse_args()
    torch.set_num_threads(1)
    export(a.src, a.out, a.calib)


if __name__ == "__main__":
    main()
