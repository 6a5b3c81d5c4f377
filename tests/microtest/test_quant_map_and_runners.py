"""The quantisation map from a checkpoint's own config files, and SGLang's MoE scaling logic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4bisect.errors import ConfigError
from dsv4bisect.microtest.runners import (
    RUNNER_CHOICES,
    expert_method,
    scaling_plan,
    should_fuse,
)
from dsv4bisect.reference.quant_formats import QuantMap, module_aliases


def write(d: Path, config: dict, hf: dict | None = None) -> Path:
    (d / "config.json").write_text(json.dumps({"model_type": "deepseek_v4", **config}))
    if hf is not None:
        (d / "hf_quant_config.json").write_text(json.dumps(hf))
    return d


def test_deepseek_official_map(tmp_path: Path) -> None:
    q = QuantMap.load(write(tmp_path, {"quantization_config": {
        "quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
        "weight_block_size": [128, 128]}, "expert_dtype": "fp4"}))
    assert q.config_class == "fp8" and q.sources == ("config.json",)
    assert q.declared("layers.7.ffn.experts.3.w2") == "mxfp4"
    assert q.declared("layers.7.ffn.shared_experts.w2") == "fp8"
    assert q.declared("layers.7.attn.wq_a") == "fp8"


def test_modelopt_nvfp4_with_exclude_globs(tmp_path: Path) -> None:
    hf = {"quantization": {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None,
                           "exclude_modules": ["lm_head", "model.layers.*.self_attn*",
                                               "model.layers.*.mlp.shared_experts*",
                                               "model.layers.0.mlp.experts*"]}}
    q = QuantMap.load(write(tmp_path, {"quantization_config": {"quant_method": "fp8"}}, hf))
    assert q.config_class == "modelopt_fp4" and q.group_size == 16
    assert q.declared("layers.5.ffn.experts.9.w1") == "nvfp4"
    assert q.declared("layers.5.ffn.experts") == "nvfp4"
    assert q.declared("layers.0.ffn.experts.9.w1") == "fp8"  # excluded: the base FP8 config
    assert q.declared("layers.5.attn.wq_b") == "fp8"
    assert q.declared("layers.5.ffn.shared_experts.w3") == "fp8"
    assert q.declared("head") == "fp8"


def test_modelopt_mixed_precision_per_module(tmp_path: Path) -> None:
    hf = {"quantization": {"quant_algo": "MIXED_PRECISION", "quantized_layers": {
        "model.layers.3.mlp.experts.0.gate_proj": {"quant_algo": "NVFP4"},
        "layers.4.attn.wq_a": {"quant_algo": "FP8"}}}}
    q = QuantMap.load(write(tmp_path, {}, hf))
    assert q.config_class == "modelopt_mixed"
    assert q.declared("layers.3.ffn.experts.0.w1") == "nvfp4"
    assert q.declared("layers.3.ffn.experts") == "nvfp4"  # the FusedMoE prefix of a listed expert
    assert q.declared("layers.3.ffn.experts.0.w3") == "dense"  # not listed, no base config
    assert q.declared("layers.4.attn.wq_a") == "fp8"


def test_config_class_from_config_json_modelopt_block(tmp_path: Path) -> None:
    q = QuantMap.load(write(tmp_path, {"quantization_config": {
        "quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ["lm_head"]}}))
    assert q.config_class == "modelopt_fp4" and q.exclude == ("lm_head",)
    assert QuantMap.load(None).config_class == "none"


def test_bad_quant_files_are_config_errors(tmp_path: Path) -> None:
    d = write(tmp_path, {})
    (d / "hf_quant_config.json").write_text("{ nope")
    with pytest.raises(ConfigError, match=r"hf_quant_config\.json:1:3: not valid JSON"):
        QuantMap.load(d)
    (d / "hf_quant_config.json").write_text(json.dumps({"quantization": {"group_size": 16}}))
    with pytest.raises(ConfigError, match="quant_algo"):
        QuantMap.load(d)


def test_module_aliases() -> None:
    assert module_aliases("layers.3.ffn.experts.5.w1") == (
        "layers.3.ffn.experts.5.w1", "model.layers.3.mlp.experts.5.gate_proj")
    assert module_aliases("layers.3.attn.wo_b")[1] == "model.layers.3.self_attn.wo_b"
    assert module_aliases("head") == ("head", "lm_head")


def test_should_fuse_reproduces_sglang() -> None:
    assert all(should_fuse("nvfp4", b) for b in RUNNER_CHOICES)
    assert [should_fuse("fp8", b) for b in ("triton", "cutlass", "flashinfer_trtllm_routed")] == \
        [False, True, True]
    assert [should_fuse("dense", b) for b in ("triton", "flashinfer_trtllm_routed")] == \
        [False, True]
    assert not should_fuse("mxfp4", "triton")


def test_scaling_contract_marlin_nvfp4_doubles_triton_nvfp4_once() -> None:
    marlin = scaling_plan("nvfp4", "marlin", is_hash=False, variant="topk")
    assert (marlin.count, marlin.where, marlin.kernel) == (2, "topk+runner", "fused_marlin_moe")
    triton = scaling_plan("nvfp4", "triton", is_hash=True, variant="topk")
    assert (triton.count, triton.where, triton.kernel) == (1, "topk", "cutlass_moe_fp4")
    stock = scaling_plan("nvfp4", "triton", is_hash=True, variant=None)
    assert not stock.buildable and "HashTopK assert" in stock.where
    assert scaling_plan("fp8", "triton", is_hash=True, variant=None).where == "runner"
    assert scaling_plan("fp8", "triton", is_hash=True, variant="double-scale").count == 2
    for backend in RUNNER_CHOICES:  # every choice scales exactly once except marlin + NVFP4
        for method in ("fp8", "dense", "mxfp4"):
            assert scaling_plan(method, backend, is_hash=False, variant="topk").count == 1
    assert expert_method("fp8-block") == "fp8" and expert_method("bf16") == "dense"
