"""fp8-wo-a-gemm — the attention output absorb GEMM (`wo_a`) in FP8 through DeepGEMM.

Speeds up: `wo_a` runs as DeepGEMM's `fp8_einsum` on its FP8 128×128 block-scaled weight
instead of dequantising it to bf16 at load (`deepseek_v4.py`, `wo_a_fp8_gemm_enabled`; read
once at import). Upstream switch `SGLANG_OPT_FP8_WO_A_GEMM` (default on); SGLang forces it off
on SM120 up to 0.5.20 and leaves it opt-in from 0.5.21 (only recent DeepGEMM builds ship the
SM120 kernels; `serving_hook.py` turns it off again when DeepGEMM's JIT is missing, which the
plugin's receipt then reports).

Numerical risk (tier 2): FP8 activations into the attention output projection of every layer.

How to verify: a bisect against the same release with the switch off (bf16 `wo_a`).

Embedded engine (`precision: deployment`; at `exact` both paths are the fp32 GEMM): off, `wo_a`
reads the attention output in bf16 on its FP8-valued weight (SGLang dequantises the FP8 weight
to bf16 at load, exactly, and runs a bf16 einsum, fp32 accumulate); on (`fp8`), it reads FP8-E4M3
activations with a UE8M0 scale per token, per group of heads and per 128 channels on the FP8
128 x 128 block weight, fp32 accumulate, as `deep_gemm.fp8_einsum("bhr,hdr->bhd")` does. Two
field faults hang here (`precision: deployment` only: they break the FP8 activation scales,
which exist only there): `scale-layout` (sglang#29038, fix PR #29036: the scales of the flat
[T·G] rows read back with group-major [G, T] semantics, so every (token, group) of a forward
with T > 1 is dequantised with another one's scale; T = 1 is exact) and `scale-truncate`
(sglang#39193, fix PR #39289: fp32 scales amax / 448 quantise the codes, the kernel reads them
with the mantissa dropped, so each 128-channel block reads (0.5, 1] of its value), this
module's `scale_layout` and `scale_truncate`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from dsv4bisect.patchspec.spec import (
    Condition,
    Patch,
    SglangDelivery,
    SglangRule,
    Variant,
    VllmDelivery,
)
from dsv4bisect.patchspec.swaps import Op, Site, Swap
from dsv4bisect.vllm_hooks import SGLANG_SWITCH

if TYPE_CHECKING:
    import torch

VAR = "SGLANG_OPT_FP8_WO_A_GEMM"
_SWITCH = dict(on={VAR: "1"}, off={VAR: "0"}, read_once=(
    f"deepseek_v4.py reads {VAR} once at import (`_FP8_WO_A_GEMM`) and the weight loader "
    "dequantises wo_a to bf16 when it is off: fixed at load"))



def _fp8_blocks(o: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """o [T, G, C] -> its 128-channel blocks [T, G, ceil(C/128), 128] (zero-padded) and
    their amax [T, G, ceil(C/128), 1]."""
    import torch.nn.functional as F

    from dsv4bisect.kernels.fp8 import ACT_GROUP

    blocks = F.pad(o, (0, -o.shape[-1] % ACT_GROUP)).unflatten(-1, (-1, ACT_GROUP))
    return blocks, blocks.abs().amax(-1, keepdim=True)


def _codes(blocks: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    import torch

    return (blocks / scale).to(torch.float8_e4m3fn).float()


def fp8(o: torch.Tensor) -> torch.Tensor:
    """o [T, G, C] as DeepGEMM's fp8_einsum reads it: FP8-E4M3, UE8M0 per token, group and
    128 channels."""
    from dsv4bisect.kernels.fp8 import fp8_activation

    return fp8_activation(o)


def scale_layout(o: torch.Tensor) -> torch.Tensor:
    """The `scale-layout` fault (sglang#29038, fix PR #29036): the FP8 path quantises o [T, G, C]
    as T·G flat rows (row t·G + g) and DeepGEMM's SM100 `fp8_einsum` reads the activation
    scales with group-major [G, T] semantics: (token t, group g) keeps its FP8 codes and is
    dequantised with the UE8M0 scale of flat row g·T + t, a power-of-two factor off. T is every
    row of the forward (all requests of a batch); T = 1 (one request decoding alone) is
    exact."""
    import torch

    from dsv4bisect.kernels.fp8 import ue8m0_scale

    T, G, C = o.shape
    blocks, amax = _fp8_blocks(o)
    scale = ue8m0_scale(amax)  # [T, G, K, 1], flat row t·G + g
    t = torch.arange(T, device=o.device)[:, None]
    g = torch.arange(G, device=o.device)[None, :]
    flat = (g * T + t).reshape(-1)  # [T·G]: the row the kernel reads for (t, g)
    read = scale.reshape(T * G, *scale.shape[2:])[flat].view_as(scale)
    return (_codes(blocks, scale) * read).flatten(-2)[..., :C]


def scale_truncate(o: torch.Tensor) -> torch.Tensor:
    """The `scale-truncate` fault (sglang#39193, fix PR #39289): with `DEEPGEMM_SCALE_UE8M0`
    false the codes of o [T, G, C] are quantised with fp32 scales amax / 448 and the kernel
    reads each scale with its mantissa dropped (the power of two at or below it), so every
    128-channel block of every (token, group) reads between half and all of its value, at any
    T."""
    import torch

    from dsv4bisect.kernels.fp8 import E4M3_MAX

    C = o.shape[-1]
    blocks, amax = _fp8_blocks(o)
    scale = torch.where(amax > 0, amax / E4M3_MAX, 1.0)
    read = torch.exp2(torch.floor(torch.log2(scale)))  # the kernel's UE8M0 of an fp32 scale
    return (_codes(blocks, scale) * read).flatten(-2)[..., :C]


def _reads(read: Callable[..., torch.Tensor]) -> Callable[[Site], Callable[..., torch.Tensor]]:
    """Embedded swap (`Op.WO_A_INPUT`, `precision: deployment` only: at `exact` both paths are
    the fp32 GEMM): the attention kernel's bf16 output, read by wo_a as `read` does."""
    return lambda site: (lambda o: read(o.bfloat16().float())) if site.deployment else None


PATCH = Patch(
    name="fp8-wo-a-gemm",
    summary="attention wo_a GEMM in FP8 via DeepGEMM fp8_einsum (SGLANG_OPT_FP8_WO_A_GEMM)",
    tier=2,
    touches=("attention.wo_a",),
    reference=("wo_a on FP8 activations (UE8M0 per token, group and 128 channels) instead of bf16 "
               "ones, on the FP8 block weight (precision: deployment)"),
    sglang=SglangDelivery(hooks={}, rules=(
        SglangRule((0, 5, 13), (0, 5, 20), "upstream", archs=("sm120",), evidence=(
            f"0.5.13-0.5.20 set {VAR}=False on SM120 unconditionally (server_args.py, "
            "arg_groups/model_hook.py): the FP8 path is never taken, not switchable")),
        SglangRule((0, 5, 21), None, "env", archs=("sm120",), **_SWITCH, evidence=(
            f"from 0.5.21 SGLang sets {VAR}=False on SM120 only when unset "
            "(arg_groups/model_hook.py): opt-in")),
        SglangRule((0, 5, 13), None, "env", archs=("sm100", "sm90"), **_SWITCH, evidence=(
            f"deepseek_v4.py reads {VAR} at import (environ.py default True)")),
    )),
    variants=(
        Variant("fp8", "DeepGEMM fp8_einsum on the FP8 wo_a weight"),
        Variant(
            "scale-layout",
            "activation scales quantised over the flat [T·G] rows, read by the kernel as "
            "group-major [G, T]: a (token, group) gets another one's scale when T > 1",
            fault=True,
            citation="sglang#29038 (fix PR #29036)",
            showed=("SM100 DeepGEMM fp8_einsum read the wo_a activation scales, quantised as "
                    "`o.reshape(T * G, D)` and viewed back as [T, G, -1], with group-major "
                    "semantics, associating scales with the wrong group: early logit "
                    "divergence and lower GPQA-Diamond, AIME25 and SWE-bench accuracy than "
                    "vLLM on DeepSeek-V4-Flash, recovered by the layout fix"),
        ),
        Variant(
            "scale-truncate",
            "fp32 activation scales amax / 448 quantise the codes; the kernel reads them "
            "truncated to a power of two (mantissa dropped)",
            fault=True,
            citation="sglang#39193 (fix PR #39289)",
            showed=("with DEEPGEMM_SCALE_UE8M0 false the wo_a branch handed fp8_einsum "
                    "non-power-of-two per-token activation scales; the kernel dropped their "
                    "mantissa without requantising the codes: the wo_a GEMM ~25 % wrong with "
                    "no error (SM121, DeepSeek-V4.1-Flash, isolated on real checkpoint "
                    "weights)"),
        ),
    ),
    inert_when=(Condition(
        "a fault of the embedded engine: SGLang's switch turns on its real FP8 path, not the bug",
        lambda ctx: ctx.kind != "reference", variants=("scale-layout", "scale-truncate")),),
    embedded=("precision: deployment only (at exact both paths are the fp32 GEMM); "
              "hot-switchable"),
    vllm=VllmDelivery("absent", SGLANG_SWITCH),
    doc=__doc__ or "",
    swaps=(Swap(Op.WO_A_INPUT, _reads(fp8), ("fp8",)),
           Swap(Op.WO_A_INPUT, _reads(scale_layout), ("scale-layout",)),
           Swap(Op.WO_A_INPUT, _reads(scale_truncate), ("scale-truncate",))),
)
