"""The built-in patches, one module each. Order is part of the wire format and of the search."""

PATCH_MODULES = (
    "mhc_bf16",
    "hash_topk_scaling",
    "mma_decode",
    "triton_indexer",
    "nvfp4_dispatch",
    "trtllm_clamp",
)
