"""The built-in patches, one module each. Order is part of the wire format and of the search."""

PATCH_MODULES = (
    "mhc_bf16",
    "hash_topk_scaling",
    "mma_decode",
    "triton_indexer",
    "nvfp4_dispatch",
    "trtllm_clamp",
    # SGLang's own DeepSeek-V4 speed switches (delivered as env vars on the releases that have
    # them; docs/sglang.md has the per-release table)
    "fused_mhc_post_pre",
    "flashinfer_mhc",
    "tilelang_indexer",
    "sm120_flashmla_backend",
    "fused_hash_topk",
    "fp8_wo_a_gemm",
    # SGLang's MTP speculative decoding (server arguments; a load-time candidate)
    "nextn_speculation",
)

# Registered only when DSV4BISECT_TEST_PATCHES=1: a deliberately broken interacting pair for
# end-to-end tests of the search on the embedded engine.
TEST_PATCH_MODULES = ("_canary_a", "_canary_b")
