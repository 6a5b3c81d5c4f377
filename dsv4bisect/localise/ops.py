"""The op names `localise` reports: what each op is and which patches and faults act on it.

One table, so a name in a report, a tap in `reference/model.py` and a test all mean the same
thing. Three kinds of op:
- a module's forward (a forward hook on an `nn.Module`; the op is named after its class);
- a functional op inside a module's forward, recorded by a one-line `tap(module, op, ...)`
  (`reference/taps.py`): the op name is the tap's;
- a state op: decoding state a prefix-cache hit, a speculative round or a batch leaves behind,
  compared against a cold prefill of the same tokens (`localise/state.py`).

`acts_on` lists `patch` or `patch:variant` (a fault variant: its `patches show` entry says
where the field bug was); an op of no patch's code says what moves it instead.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Op:
    name: str
    what: str
    acts_on: tuple[str, ...] = ()
    per_group: bool = False  # rows are one sequence of a group ([B, T, ...]), not the step's N
    compared: bool = True  # False: kept for a repro only (key pools, schedules)
    kind: str = "tap"  # tap | module | state | spec


# functional ops: the `tap` sites of reference/model.py, in execution order within a layer
TAPS = (
    Op("mhc.pre_attn", "mHC pre of the attention sublayer: mixes (pre-norm GEMM, split-K by "
       "the batch's token count at deployment), Sinkhorn, the collapse of the streams",
       ("mhc-bf16", "fused-mhc-post-pre", "flashinfer-mhc")),
    Op("attn.q", "the query path after its per-head RMSNorm and RoPE"),
    Op("attn.kv_write", "the new K=V rows as the FP8 KV pages hold them (the KV write)",
       ("mma-decode:batch-kv-slot",)),
    Op("compressor.entries", "the compressed KV entries a compressor writes (pooling, RMSNorm, "
       "RoPE at the window's first position, FP8 page write)",
       ("mma-decode:compress-rope-base",), per_group=True),
    Op("indexer.scores", "the lightning indexer's scores over the visible entries",
       ("triton-indexer", "tilelang-indexer"), per_group=True),
    Op("indexer.topk", "the indexer's top-k entry ids", ("triton-indexer:residue",),
       per_group=True),
    Op("attn.key_pool", "a group's key pool as the kernel reads it, its key lists and window "
       "rows (the sparse attention's inputs)", ("mma-decode:decode-rope-fp8",), per_group=True,
       compared=False),
    Op("attn.sparse_attention", "the sparse MQA attention kernel (split-K decode kernel of "
       "mma-decode: 64-key partials and their merge)",
       ("mma-decode", "mma-decode:decode-rope-fp8", "sm120-flashmla-backend")),
    Op("attn.o", "the attention output after the inverse RoPE of its rope dims: wo_a's input"),
    Op("attn.wo_a", "wo_a: the grouped low-rank output GEMM and how it reads the attention "
       "output (bf16 einsum, or FP8 with per-token scales)",
       ("fp8-wo-a-gemm", "fp8-wo-a-gemm:scale-layout", "fp8-wo-a-gemm:scale-truncate")),
    Op("mhc.post_attn", "mHC post of the attention sublayer (post·o + comb·H)"),
    Op("mhc.pre_ffn", "mHC pre of the MoE sublayer (the fused post+pre boundary)",
       ("mhc-bf16", "fused-mhc-post-pre", "flashinfer-mhc")),
    Op("moe.combine", "the MoE combine: Σ_k w_k·expert_k(x) with the routed scaling factor "
       "(NVFP4 experts at deployment)",
       ("hash-topk-scaling", "hash-topk-scaling:double-scale", "nvfp4-dispatch",
        "trtllm-clamp", "trtllm-clamp:ignore-alpha")),
    Op("mhc.head", "the final collapse of the streams (hc_head) as the head reads it"),
)

# each swappable place of the embedded engine (`patchspec.swaps.Op`'s value) -> the ops that
# record what the implementation in it computes: a patch's code is named where it acts
PLACES: dict[str, tuple[str, ...]] = {
    "mhc_mixes": ("mhc.pre_attn", "mhc.pre_ffn"),
    "attention": ("attn.sparse_attention",),
    "kv_write": ("attn.kv_write", "state.kv_rows"),
    "kv_read": ("attn.key_pool",),
    "compressed_rope": ("compressor.entries",),
    "indexer_logits": ("indexer.scores",),
    "indexer_topk": ("indexer.topk",),
    "wo_a_input": ("attn.wo_a",),
    "routed_scaling": ("moe.combine",),
    "expert_quant": ("moe.combine",),
    "expert_clamp": ("moe.combine",),
    "head_input": ("mhc.head",),
    "speculation": ("spec.verify", "spec.stop_check"),
    "spec_verify": ("spec.verify", "spec.stop_check"),
    "window_store": ("state.swa_window",),
}

# sub-ops of the sparse attention kernel, told apart by running it again on its saved inputs
# under both configurations (localise/kernel_split.py)
KERNEL_PARTS = (
    Op("attn.sparse_attention.partials", "the split-K decode kernel's per-split partial "
       "outputs and log-sum-exps", ("mma-decode",), kind="kernel"),
    Op("attn.sparse_attention.merge", "the split-K decode merge (partials merged by their "
       "log-sum-exp, the sink after the merge)", ("mma-decode:merge-no-rescale",),
       kind="kernel"),
)

# module forwards: the class name of the module -> its op
MODULES = {
    "Embedding": Op("embed", "the token embedding (must be bit-identical: alignment)",
                    kind="module"),
    "RMSNorm": Op("rmsnorm", "an RMSNorm", kind="module"),
    "Linear": Op("linear", "a linear layer (block-FP8 GEMM at deployment where the "
                 "checkpoint stores FP8)", kind="module"),
    "Gate": Op("router", "the MoE router: expert weights and ids", kind="module"),
    "Indexer": Op("indexer", "the lightning indexer (its top-k ids)", per_group=True,
                  kind="module"),
    "Attention": Op("attention", "the attention sublayer", kind="module"),
    "MoE": Op("moe", "the MoE sublayer (routed + shared experts)", kind="module"),
    "Block": Op("block", "a decoder layer (its output: mHC post of the MoE sublayer)",
                kind="module"),
    "Expert": Op("expert", "an expert's MLP", kind="module"),
}

# decoding state (localise/state.py) and speculative rounds
STATE = (
    Op("state.swa_window", "the sliding-window K=V rows a prefix-cache hit restores",
       ("mma-decode:swa-ring-stale",), kind="state"),
    Op("state.kv_rows", "the K=V rows the cache holds after batched steps (the KV write at "
       "concurrency)", ("mma-decode:batch-kv-slot",), kind="state"),
    Op("state.compressor", "a compressor's pending window and previous half", kind="state"),
    Op("state.entries", "a compressor's compressed entries", kind="state"),
    Op("state.indexer_keys", "the indexer's compressed keys", kind="state"),
    Op("state.mtp", "the MTP layer's state (window and held streams)", kind="state"),
    Op("spec.stop_check", "the speculative round's stop check (which tokens end a request)",
       ("nextn-speculation:draft-eos",), kind="spec"),
    Op("spec.verify", "the speculative round's verification (which drafts are accepted)",
       ("nextn-speculation:greedy-verify",), kind="spec"),
)

BY_NAME: dict[str, Op] = {o.name: o for o in (*TAPS, *KERNEL_PARTS, *MODULES.values(), *STATE)}


def op(name: str) -> Op:
    """The op named `name` (a KeyError names an op the table lacks: a tap without an entry)."""
    return BY_NAME[name]


def module_op(class_name: str) -> Op | None:
    return MODULES.get(class_name)
