"""sm120-flashmla-backend — SGLang's SM120 sparse decode backend (FlashInfer split-K).

Speeds up: `flash_mla_with_kvcache_sm120` dispatches on `SGLANG_SM120_FLASHMLA_BACKEND`, read
once when `flash_mla_sm120.py` is imported (0.5.15+): `flashinfer` (the default: CUTLASS SM120
sparse MLA decode, 64-key splits, bf16 `mid_out`, fp32 `mid_lse`), `triton`, or `torch` (the
fp32 reference, used as `off`).

Numerical risk (tier 2): bf16 partial outputs merged by LSE; the error grows with the number of
splits, i.e. with context — upstream's own version of mma-decode's split-K numerics.

How to verify: a bisect against the same release with `off` (torch). The embedded engine runs
`flashinfer` as the mma-decode `split-k` numerics (64-key splits, bf16 partials, fp32 LSE merge)
and `triton` as fp32 partials (its real kernel's rounding is not reproduced).
"""

from __future__ import annotations

from dsv4bisect.patching.spec import Mask, Patch, SglangDelivery, SglangRule, Variant

VAR = "SGLANG_SM120_FLASHMLA_BACKEND"

PATCH = Patch(
    name="sm120-flashmla-backend",
    summary="SM120 sparse decode by FlashInfer split-K (SGLANG_SM120_FLASHMLA_BACKEND)",
    tier=2,
    touches=("attention.sparse_decode",),
    reference="decode attention in 64-key splits with bf16 partials and an fp32 LSE merge",
    sglang=SglangDelivery(hooks={}, rules=(
        SglangRule((0, 5, 13), (0, 5, 14), "absent", evidence=(
            f"{VAR} first appears in 0.5.15 (environ.py, flash_mla_sm120.py)")),
        SglangRule((0, 5, 15), None, "env", archs=("sm120",), on={VAR: "{variant}"},
                   off={VAR: "torch"}, read_once=(
                       f"flash_mla_sm120.py copies {VAR} into a module global once at import "
                       "(`_sm120_default_backend`): fixed at load"), evidence=(
                       f"flash_mla_sm120.py: _sm120_default_backend = envs.{VAR}.get() at "
                       "import; 'flashinfer' default, 'triton' and 'torch' fallbacks")),
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
    doc=__doc__ or "",
)
