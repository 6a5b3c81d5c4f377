"""sm120-flashmla-backend — SGLang's SM120 sparse decode backend (FlashInfer split-K).

Speeds up: `flash_mla_with_kvcache_sm120` dispatches on `SGLANG_SM120_FLASHMLA_BACKEND` (0.5.15+):
`flashinfer` (the default: CUTLASS SM120 sparse MLA decode, 64-key splits, bf16 `mid_out`, fp32
`mid_lse`), `triton`, or `torch` (the fp32 reference, used as `off`).

When it is decided: `flash_mla_sm120.py` copies the variable into the module global
`_sm120_default_backend` at import, and `flash_mla_with_kvcache_sm120` compares that global at
every call (`if _sm120_default_backend == "flashinfer"` / `"triton"`, else torch); DeepSeek-V4's
attention backend imports the function at call time, and from 0.5.20 `deepseek_v4.py`
(`_kernel_num_heads`) reads `envs.SGLANG_SM120_FLASHMLA_BACKEND.get()` per call for the query's
head padding. Nothing is prepared at load for one backend: the FlashInfer page-split buffers are
allocated at its first call, the Triton module is imported at its first call, and the sliced
attention sink keeps the padded width for every backend. So it is switched hot: the plugin sets
the variable and assigns the global again (`SglangRule.copies`), then re-captures the decode
graphs (a captured graph has the old backend's kernels baked in).

Numerical risk (tier 2): bf16 partial outputs merged by LSE; the error grows with the number of
splits, i.e. with context — upstream's own version of mma-decode's split-K numerics.

How to verify: a bisect against the same release with `off` (torch). The embedded engine runs
`flashinfer` as the mma-decode `split-k` numerics (64-key splits, bf16 partials, fp32 LSE merge)
and `triton` as fp32 partials (its real kernel's rounding is not reproduced).
"""

from __future__ import annotations

from typing import Any

from dsv4bisect.patches.mma_decode import split_k
from dsv4bisect.patchspec.spec import (
    ImportCopy,
    Mask,
    Patch,
    SglangDelivery,
    SglangRule,
    Variant,
    VllmDelivery,
)
from dsv4bisect.patchspec.swaps import Op, Swap
from dsv4bisect.vllm_hooks import SGLANG_SWITCH

VAR = "SGLANG_SM120_FLASHMLA_BACKEND"
GLOBAL = "_sm120_default_backend"
_OLD = "sglang.srt.layers.attention.flash_mla_sm120"  # 0.5.15 – 0.5.15.post1
_NEW = "sglang.kernels.ops.attention.flash_mla_sm120"  # 0.5.16+ (the kernels/ops move)


def _switch(module: str) -> dict[str, Any]:
    file = module.replace(".", "/") + ".py"
    return dict(on={VAR: "{variant}"}, off={VAR: "torch"}, copies=(
        ImportCopy(module, GLOBAL, VAR),), evidence=(
        f"{file}: {GLOBAL} = envs.{VAR}.get() at import, compared at every call of "
        "flash_mla_with_kvcache_sm120 ('flashinfer' default, 'triton', else torch); nothing "
        "backend-specific is built at load (switched hot by re-assigning the global)"))


PATCH = Patch(
    name="sm120-flashmla-backend",
    summary="SM120 sparse decode by FlashInfer split-K (SGLANG_SM120_FLASHMLA_BACKEND)",
    tier=2,
    touches=("attention.sparse_decode",),
    reference="decode attention in 64-key splits with bf16 partials and an fp32 LSE merge",
    sglang=SglangDelivery(hooks={}, rules=(
        SglangRule((0, 5, 13), (0, 5, 14), "absent", evidence=(
            f"{VAR} first appears in 0.5.15 (environ.py, flash_mla_sm120.py)")),
        SglangRule((0, 5, 15), (0, 5, 15, 1), "env", archs=("sm120",), **_switch(_OLD)),
        SglangRule((0, 5, 16), None, "env", archs=("sm120",), **_switch(_NEW)),
        SglangRule((0, 5, 15), None, "absent", archs=("sm100", "sm90"), evidence=(
            "flash_mla_with_kvcache_sm120 is called on SM120 only")),
    )),
    variants=(
        Variant("flashinfer", "FlashInfer CUTLASS split-K decode (upstream default)"),
        Variant("triton", "SGLang's Triton SM120 decode fallback"),
    ),
    masked_by=(Mask("mma-decode", "the mma-decode hook replaces flash_mla_with_kvcache_sm120, "
                    "which is where the backend is chosen"),),
    embedded="flashinfer: the mma-decode split-k numerics; triton: fp32 partials",
    vllm=VllmDelivery("absent", SGLANG_SWITCH),
    doc=__doc__ or "",
    swaps=(Swap(Op.ATTENTION, split_k("bfloat16", "lse"), ("flashinfer",)),
           Swap(Op.ATTENTION, split_k("float32", "lse"), ("triton",))),
)
