"""Hook bodies that act at construction or weight-loading time, on the objects they read."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dsv4bisect.sglang_hooks import contract
from dsv4bisect.sglang_hooks.quant import (
    _limit_to_runner,
    _raw_limit_0514,
    clamp_plan,
    dispatch_plan,
    divide_by_alpha,
)

torch = pytest.importorskip("torch")


class Rec:
    def __init__(self) -> None:
        self.calls, self.logs = [], []

    def called(self, target: str) -> None:
        self.calls.append(target)

    def log(self, key: str, value: object) -> None:
        self.logs.append((key, value))


def nvfp4_layer(limit: float | None = 10.0, gated: bool = True):
    return SimpleNamespace(layer_id=7, g1_alphas=torch.tensor([0.5, 2.0, 0.25]),
                           moe_runner_config=SimpleNamespace(swiglu_limit=limit, is_gated=gated,
                                                             gemm1_clamp_limit=None))


def test_0513_alpha_gives_the_kernel_limit_over_alpha_per_expert():
    layer = nvfp4_layer()
    assert _limit_to_runner(layer, SimpleNamespace(enable_flashinfer_trtllm_moe=True)) == 10.0
    # SGLang 0.5.13's runner then passes full(local_experts, gemm1_clamp_limit) to the kernel
    clamp = torch.full((3,), layer.moe_runner_config.gemm1_clamp_limit)
    seen = {}
    divide_by_alpha(lambda **kw: seen.update(kw), gemm1_clamp_limit=clamp,
                    output1_scale_gate_scalar=layer.g1_alphas)
    assert torch.equal(seen["gemm1_clamp_limit"], torch.tensor([20.0, 5.0, 40.0]))


def test_0513_clamp_is_inert_off_the_trtllm_path():
    layer = nvfp4_layer()
    assert _limit_to_runner(layer, SimpleNamespace(enable_flashinfer_trtllm_moe=False)) is None
    assert layer.moe_runner_config.gemm1_clamp_limit is None
    seen = {}
    divide_by_alpha(lambda **kw: seen.update(kw), gemm1_clamp_limit=None,
                    output1_scale_gate_scalar=layer.g1_alphas)
    assert seen["gemm1_clamp_limit"] is None


def test_0514_ignore_alpha_overwrites_upstreams_per_expert_limit():
    layer = nvfp4_layer()
    layer.gemm1_clamp_limit = torch.nn.Parameter(10.0 / layer.g1_alphas, requires_grad=False)
    assert _raw_limit_0514(layer) == 10.0
    assert torch.equal(layer.gemm1_clamp_limit.data, torch.full((3,), 10.0))


def test_plans_per_layout_and_variant():
    assert clamp_plan("alpha", "0.5.14", Rec()).action == "inert"
    assert [h.target.rsplit(".", 1)[-1] for h in clamp_plan("alpha", "0.5.13", Rec()).hooks] == [
        "process_weights_after_loading", "trtllm_fp4_block_scale_moe",
        "trtllm_fp4_block_scale_routed_moe"]
    assert len(clamp_plan("ignore-alpha", "0.5.13", Rec()).hooks) == 1
    refused = dispatch_plan("weights-only", "0.5.13", Rec())
    assert refused.action == "refuse" and "marlin" in refused.reason


@pytest.mark.parametrize("method,backend,fuse,expect", [
    ("ModelOptNvFp4FusedMoEMethod", "triton", True, False),   # cutlass_moe_fp4: once, in top-k
    ("ModelOptNvFp4FusedMoEMethod", "marlin", True, True),    # the stock double-scale bug
    ("Fp8MoEMethod", "triton", False, True),
    ("Fp8MoEMethod", "cutlass", True, False),
    ("ModelOptNvFp4FusedMoEMethod", "flashinfer_cutedsl", True, None),
])
def test_runner_rule(method, backend, fuse, expect):
    assert contract.runner_scales(method, backend, fuse, True)[0] is expect


def test_contract_row_counts_every_application():
    moe = SimpleNamespace(layer_id=0, is_hash=True,
                          topk=SimpleNamespace(apply_routed_scaling_factor_on_output=True),
                          experts=SimpleNamespace(
                              quant_method=type("ModelOptNvFp4FusedMoEMethod", (), {
                                  "_moe_runner_backend": "marlin"})(),
                              should_fuse_routed_scaling_factor_in_topk=True,
                              moe_runner_config=SimpleNamespace(routed_scaling_factor=1.5)))
    row = contract.layer_row(moe, 0)
    assert (row["times_applied"], row["exactly_once"], row["backend"]) == (2, False, "marlin")
