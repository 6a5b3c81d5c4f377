"""SGLang's MoE logic that decides who applies `routed_scaling_factor` (rsf) and who clamps, as
data: which quant method a layer's routed experts get, `should_fuse_routed_scaling_factor_in_topk`,
and what each runner backend does with rsf and with `swiglu_limit` (no torch).

Sources: notes/sglang-dsv4.md §1.4, §4 patches 2, 5, 6 (SGLang 0.5.13/0.5.14), confirmed in
`FusedMoE.__init__` and `ModelOptNvFp4FusedMoEMethod.apply`:

- `should_fuse = NVFP4 method or (FP8 method and backend in {cutlass, flashinfer_trtllm_routed})
  or (unquantised and backend == flashinfer_trtllm_routed)`; when true TopK (non-hash layers)
  and HashTopK (hash layers, with the `hash-topk-scaling` patch or SGLang >= 0.5.14) multiply the
  top-k weights by rsf. Stock HashTopK (<= 0.5.13) asserts "not implemented" instead.
- The runner: the Triton runner (`moe_sum_reduce`) and Marlin (`fused_marlin_moe`) always
  multiply; NVFP4 under `triton` falls through to `cutlass_moe_fp4` and under
  `flashinfer_cutlass` to `flashinfer_cutlass_fused_moe`, which do not ("fused into
  select_experts"); the TRT-LLM *routed* kernel gets `routed_scaling_factor=None`. MXFP4 experts
  (the official checkpoint) get rsf once where the routed output meets the shared expert.
- Clamp: the Triton runner and Marlin clamp at `swiglu_limit`; `cutlass_moe_fp4` and the
  flashinfer cutlass kernel do not; the TRT-LLM NVFP4 path clamps only with `trtllm-clamp`.
Assumptions where the notes are silent are marked in `RunnerPath.note`.
"""

from __future__ import annotations

from dataclasses import dataclass

# The four runner choices the scaling contract is checked for (SGLang `--moe-runner-backend`).
RUNNER_CHOICES = ("triton", "marlin", "flashinfer_trtllm_routed", "flashinfer_cutlass")
RUNNER_LABELS = {"triton": "triton", "marlin": "marlin", "flashinfer_trtllm_routed": "TRT-LLM",
                 "flashinfer_trtllm": "TRT-LLM (self-routed)",
                 "flashinfer_cutlass": "cutlass NVFP4", "cutlass": "cutlass"}
# Stored expert format -> the SGLang FusedMoE quant method that loads it.
MOE_METHODS = {"nvfp4": "ModelOptNvFp4FusedMoEMethod", "fp8": "Fp8MoEMethod",
               "mxfp4": "DeepSeek-V4 MXFP4 experts", "dense": "UnquantizedFusedMoEMethod"}


def expert_method(stored: str) -> str:
    """`nvfp4`, `fp8`, `mxfp4` or `dense` from a stored format (`fp8-block`, `bf16`, ...)."""
    if stored.startswith("fp8"):
        return "fp8"
    return stored if stored in ("nvfp4", "mxfp4") else "dense"


def should_fuse(method: str, backend: str) -> bool:
    """SGLang's `FusedMoE.should_fuse_routed_scaling_factor_in_topk`."""
    return (
        method == "nvfp4"
        or (method == "fp8" and backend in ("cutlass", "flashinfer_trtllm_routed"))
        or (method == "dense" and backend == "flashinfer_trtllm_routed")
    )


@dataclass(frozen=True)
class RunnerPath:
    """What runs a layer's routed experts, and whether it multiplies by rsf and clamps."""

    kernel: str
    scales: bool
    clamps: bool | None  # None: only with the trtllm-clamp patch
    note: str = ""


def runner_path(method: str, backend: str) -> RunnerPath:
    """The kernel a (quant method, backend) pair reaches in ModelOpt/Fp8/unquantised apply()."""
    if method == "mxfp4":
        return RunnerPath("MXFP4 experts", True, True, "rsf at the shared-expert add")
    if backend == "marlin":
        return RunnerPath("fused_marlin_moe", True, True)
    if method == "nvfp4":
        if backend == "flashinfer_trtllm_routed":
            return RunnerPath("trtllm_fp4_block_scale_routed_moe", False, None)
        if backend == "flashinfer_cutlass":
            return RunnerPath("flashinfer_cutlass_fused_moe", False, False)
        return RunnerPath("cutlass_moe_fp4", False, False, "NVFP4 under triton falls through")
    if backend == "flashinfer_trtllm_routed":
        return RunnerPath("trtllm routed MoE", False, True, "assumed to clamp like triton")
    if backend == "flashinfer_cutlass":
        return RunnerPath("fused_moe (triton)", True, True,
                          "assumed: non-NVFP4 experts keep the triton runner")
    return RunnerPath("fused_moe (triton)", True, True)


@dataclass(frozen=True)
class ScalingPlan:
    """Where rsf is applied on one MoE layer: in top-k, in the runner, how often."""

    topk: bool
    runner: bool
    buildable: bool = True  # False: stock HashTopK asserts (the layer cannot be constructed)
    kernel: str = ""

    @property
    def count(self) -> int:
        return int(self.topk) + int(self.runner)

    @property
    def where(self) -> str:
        if not self.buildable:
            return "cannot build (HashTopK assert)"
        sites = [s for s, on in (("topk", self.topk), ("runner", self.runner)) if on]
        return "+".join(sites) or "nowhere"


def scaling_plan(method: str, backend: str, *, is_hash: bool, variant: str | None) -> ScalingPlan:
    """The plan under hash-topk-scaling `variant` (None: the patch off, stock <= 0.5.13;
    `topk`: HashTopK multiplies iff should_fuse, as upstream >= 0.5.14; `double-scale`†: the
    hash layer is scaled in HashTopK and in the runner)."""
    fuse = should_fuse(method, backend)
    path = runner_path(method, backend)
    if not is_hash:
        return ScalingPlan(fuse, path.scales, kernel=path.kernel)
    if variant is None:
        return ScalingPlan(False, path.scales, buildable=not fuse, kernel=path.kernel)
    if variant == "double-scale":
        return ScalingPlan(True, True, kernel=path.kernel)
    return ScalingPlan(fuse, path.scales, kernel=path.kernel)
