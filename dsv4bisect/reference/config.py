"""The embedded model's configuration (`ModelArgs`, Hugging Face DeepSeek-V4 field names) and the
numerics a patch set selects (`Numerics`).

`ModelArgs` reads and writes the `config.json` DeepSeek ships (the HF `DeepseekV4Config` fields:
`compress_ratios`, `num_hash_layers`, `hc_mult`, `index_topk`, ...). Named presets: `tiny` (every
mechanism active within a few hundred tokens) and `flash` (the real DeepSeek-V4-Flash values, used
to build single real layers, never run whole on CPU). This module imports no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any

from dsv4bisect.errors import ConfigError, PatchError

CSA_RATIO = 4  # the one ratio with the overlapping two-half compressor and the lightning indexer
ATTN_SPLIT = 64  # list positions per split of the split-K attention (mma-decode)

# MoE runner backends the embedded engine knows (SGLang's `--moe-runner-backend` names).
MOE_BACKENDS = (
    "triton",
    "marlin",
    "flashinfer_trtllm",
    "flashinfer_trtllm_routed",
    "flashinfer_cutlass",
    "flashinfer_cutedsl",
    "cutlass",
    "deep_gemm",
)
TRTLLM_BACKENDS = frozenset({"flashinfer_trtllm", "flashinfer_trtllm_routed"})
# NVFP4 routed experts under `triton` fall through to SGLang's `cutlass_moe_fp4`, which calls a
# plain `silu_and_mul`: no SwiGLU clamp (notes/sglang-dsv4.md §1.5).
NVFP4_UNCLAMPED_BACKENDS = frozenset({"triton"})
# Marlin's NVFP4 MoE is weight-only (W4A16: bf16 activations); every other NVFP4 MoE path SGLang
# has (cutlass_moe_fp4 under `triton`, FlashInfer TRT-LLM / CUTLASS / CuteDSL) quantises the
# expert GEMM inputs to NVFP4 too (W4A4).
NVFP4_W4A16_BACKENDS = frozenset({"marlin"})
# `deployment`: stored and computed as the seed deployment (NVFP4 routed experts, FP8 attention
# and shared experts, FP8 KV cache and indexer keys); `exact`: the fp32 path (fidelity, training).
PRECISIONS = ("deployment", "exact")


@dataclass(frozen=True)
class RopeScaling:
    """YaRN frequency interpolation of the compressed layers (no attention mscale)."""

    factor: float = 16.0
    original_max_position_embeddings: int = 65536
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    def to_hf(self) -> dict[str, Any]:
        return {"type": "yarn", **asdict(self)}


@dataclass(frozen=True)
class ModelArgs:
    """DeepSeek-V4 hyper-parameters under their Hugging Face names."""

    vocab_size: int = 129280
    hidden_size: int = 4096
    num_hidden_layers: int = 43
    num_attention_heads: int = 64
    head_dim: int = 512
    qk_rope_head_dim: int = 64
    q_lora_rank: int = 1024
    o_lora_rank: int = 1024
    o_groups: int = 8
    sliding_window: int = 128
    compress_ratios: tuple[int, ...] = (0, 0) + (4, 128) * 20 + (4, 0)
    compress_rope_theta: float = 160000.0
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = field(default_factory=RopeScaling)
    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 512
    n_routed_experts: int = 256
    num_experts_per_tok: int = 6
    n_shared_experts: int = 1
    moe_intermediate_size: int = 2048
    scoring_func: str = "sqrtsoftplus"
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.5
    num_hash_layers: int = 3
    swiglu_limit: float = 10.0
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    rms_norm_eps: float = 1e-6
    num_nextn_predict_layers: int = 1
    max_position_embeddings: int = 1048576
    bos_token_id: int = 0
    eos_token_id: int = 1
    tie_word_embeddings: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "compress_ratios", tuple(int(r) for r in self.compress_ratios))
        _validate(self)

    # ---- presets ---------------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str) -> ModelArgs:
        if name not in PRESETS:
            raise ConfigError(f"unknown model preset `{name}`", f"presets: {', '.join(PRESETS)}")
        return PRESETS[name]

    # ---- derived ----------------------------------------------------------------------------
    @property
    def nope_head_dim(self) -> int:
        return self.head_dim - self.qk_rope_head_dim

    def ratio(self, layer: int) -> int:
        """Compression ratio of decoder layer `layer`; MTP layer i is `num_hidden_layers + i`."""
        return self.compress_ratios[layer] if layer < len(self.compress_ratios) else 0

    def layer_kind(self, layer: int) -> str:
        """`swa` (window only), `csa` (ratio 4, overlap + indexer) or `hca` (dense over entries)."""
        r = self.ratio(layer)
        return "swa" if r == 0 else "csa" if r == CSA_RATIO else "hca"

    def is_hash_layer(self, layer: int) -> bool:
        return layer < min(self.num_hash_layers, self.num_hidden_layers)

    # ---- Hugging Face config.json ---------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any], *, source: str = "config.json") -> ModelArgs:
        """Build from a DeepSeek-V4 `config.json` dict; unknown keys (quantization, ...) are ignored."""
        if not isinstance(cfg, Mapping):
            raise ConfigError(f"{source}: expected a JSON object", "use the model's config.json")
        model_type = cfg.get("model_type", "deepseek_v4")
        if model_type != "deepseek_v4":
            raise ConfigError(
                f"{source}: model_type is `{model_type}`, not `deepseek_v4`",
                "the embedded engine only builds DeepSeek-V4 checkpoints",
            )
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in cfg or cfg[f.name] is None and f.name != "rope_scaling":
                continue
            kwargs[f.name] = _coerce(f.name, cfg[f.name], source)
        if "compress_ratios" not in kwargs and "num_hidden_layers" in kwargs:
            raise ConfigError(f"{source}: missing `compress_ratios`", "list one ratio per layer")
        return cls(**kwargs)

    def to_hf_config(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "architectures": ["DeepseekV4ForCausalLM"],
            "model_type": "deepseek_v4",
            "torch_dtype": "float32",
        }
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "rope_scaling":
                value = value.to_hf() if value is not None else None
            elif f.name == "compress_ratios":
                value = list(value)
            out[f.name] = value
        out["num_key_value_heads"] = 1
        out["v_head_dim"] = self.head_dim
        out["topk_method"] = "noaux_tc"
        out["hidden_act"] = "silu"
        return out

    def with_(self, **changes: Any) -> ModelArgs:
        return replace(self, **changes)


def _coerce(name: str, value: Any, source: str) -> Any:
    """Check the JSON type of one field; a wrong type is a ConfigError naming the field."""
    if name == "rope_scaling":
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise ConfigError(f"{source}: `rope_scaling` must be an object or null")
        kind = value.get("type", value.get("rope_type", "yarn"))
        if kind != "yarn":
            raise ConfigError(f"{source}: rope_scaling type `{kind}` unsupported", "use yarn")
        keys = {f.name for f in fields(RopeScaling)}
        return RopeScaling(**{k: value[k] for k in keys if k in value})
    if name == "compress_ratios":
        if not isinstance(value, list | tuple) or not all(_is_int(v) for v in value):
            raise ConfigError(f"{source}: `compress_ratios` must be a list of integers")
        return tuple(value)
    if name == "eos_token_id" and isinstance(value, list | tuple) and value:
        value = value[0]  # HF allows a list; the first is the end-of-sequence id
    default = next(f.default for f in fields(ModelArgs) if f.name == name)
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = _is_int(value)
    elif isinstance(default, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
    else:
        ok = isinstance(value, str)
    if not ok:
        raise ConfigError(f"{source}: `{name}` has the wrong type ({type(value).__name__})")
    return value


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _validate(a: ModelArgs) -> None:
    """Raise ConfigError for values no DeepSeek-V4 can have (the message names the field)."""
    hint = "fix config.json (field names as in Hugging Face's DeepseekV4Config)"
    positive = (
        "vocab_size hidden_size num_hidden_layers num_attention_heads head_dim q_lora_rank "
        "o_lora_rank o_groups sliding_window index_n_heads index_head_dim index_topk "
        "n_routed_experts num_experts_per_tok moe_intermediate_size hc_mult hc_sinkhorn_iters "
        "max_position_embeddings"
    ).split()
    for name in positive:
        if getattr(a, name) <= 0:
            raise ConfigError(f"`{name}` must be positive, got {getattr(a, name)}", hint)
    checks = [
        (
            len(a.compress_ratios) >= a.num_hidden_layers,
            f"`compress_ratios` has {len(a.compress_ratios)} entries for "
            f"{a.num_hidden_layers} layers (one per layer, then one per MTP layer)",
        ),
        (
            all(r == 0 or r >= 2 for r in a.compress_ratios),
            f"`compress_ratios` entries must be 0 or >= 2, got {list(a.compress_ratios)}",
        ),
        (
            0 < a.qk_rope_head_dim <= min(a.head_dim, a.index_head_dim)
            and a.qk_rope_head_dim % 2 == 0,
            "`qk_rope_head_dim` must be even and at most head_dim and index_head_dim",
        ),
        (
            a.num_attention_heads % a.o_groups == 0,
            "`num_attention_heads` must divide by `o_groups`",
        ),
        (
            a.num_experts_per_tok <= a.n_routed_experts,
            "`num_experts_per_tok` exceeds `n_routed_experts`",
        ),
        (
            a.scoring_func in ("sqrtsoftplus", "sigmoid", "softmax"),
            f"`scoring_func` `{a.scoring_func}` unsupported (sqrtsoftplus, sigmoid, softmax)",
        ),
        (
            a.n_shared_experts >= 0 and a.num_hash_layers >= 0 and a.num_nextn_predict_layers >= 0,
            "`n_shared_experts`, `num_hash_layers`, `num_nextn_predict_layers` must be >= 0",
        ),
        (
            0 <= a.bos_token_id < a.vocab_size and 0 <= a.eos_token_id < a.vocab_size,
            "`bos_token_id` / `eos_token_id` outside the vocabulary",
        ),
        (
            a.swiglu_limit >= 0
            and a.routed_scaling_factor > 0
            and math.isfinite(a.routed_scaling_factor),
            "`swiglu_limit` must be >= 0 and `routed_scaling_factor` > 0",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message, hint)


_TINY = ModelArgs(
    vocab_size=512,
    hidden_size=256,
    num_hidden_layers=6,
    num_attention_heads=4,
    head_dim=64,
    qk_rope_head_dim=16,
    q_lora_rank=128,
    o_lora_rank=64,
    o_groups=2,
    sliding_window=16,
    compress_ratios=(0, 0, 4, 16, 4, 16, 0),
    index_n_heads=4,
    index_head_dim=32,
    index_topk=8,
    n_routed_experts=16,
    num_experts_per_tok=2,
    n_shared_experts=1,
    moe_intermediate_size=64,
)
PRESETS: Mapping[str, ModelArgs] = MappingProxyType({"tiny": _TINY, "flash": ModelArgs()})


# ---- numerics: what a patch set changes in the reference ----------------------------------------


@dataclass(frozen=True)
class Numerics:
    """A patch set (name -> variant, in registry order) plus the profile's MoE runner backend,
    precision and NVFP4 map: what `Transformer.configure` builds the model's swappable places
    from (`reference/swappable.py`; each patch's swaps are in its own module).

    `precision` is `exact` (fp32; NVFP4 only through `nvfp4-dispatch`) or `deployment` (the
    seed deployment's formats, `reference/precision.py`; the routed experts are NVFP4 as the
    checkpoint stores them, whatever the patches say). `nvfp4_layers` is the NVFP4 map: the MoE
    layers whose routed experts are NVFP4 (None = every MoE layer of the main model, as the
    hybrid checkpoint has it); at `exact` it applies when `nvfp4-dispatch` is on.
    """

    patches: Mapping[str, str] = field(default_factory=dict)
    moe_backend: str = "triton"
    nvfp4_layers: frozenset[int] | None = None
    precision: str = "exact"

    def __post_init__(self) -> None:
        object.__setattr__(self, "patches", MappingProxyType(dict(self.patches)))
        if self.nvfp4_layers is not None:
            object.__setattr__(self, "nvfp4_layers", frozenset(self.nvfp4_layers))
        if self.precision not in PRECISIONS:
            raise ConfigError(f"unknown precision `{self.precision}`",
                              f"use one of: {', '.join(PRECISIONS)}")

    @classmethod
    def from_patches(
        cls,
        patches: Mapping[str, str] | None = None,
        moe_backend: str = "triton",
        nvfp4_layers: frozenset[int] | None = None,
        precision: str = "exact",
    ) -> Numerics:
        """Validate names and variants against the built-in registry (PatchError otherwise)."""
        from dsv4bisect.errors import did_you_mean
        from dsv4bisect.patching.registry import builtin_patches, unknown_patch_hint

        known = builtin_patches()
        resolved: dict[str, str] = {}
        for name, variant in (patches or {}).items():
            if name not in known:
                raise PatchError(f"unknown patch `{name}`", unknown_patch_hint(name, known))
            variant = variant or known[name].default_variant
            if known[name].variant(variant) is None:
                names = [v.name for v in known[name].variants]
                guess = did_you_mean(variant, names)
                raise PatchError(
                    f"patch `{name}` has no variant `{variant}`",
                    f"{guess + ' ' if guess else ''}variants of {name}: {', '.join(names)}",
                )
            resolved[name] = variant
        if moe_backend not in MOE_BACKENDS:
            guess = did_you_mean(moe_backend, MOE_BACKENDS)
            raise ConfigError(
                f"unknown MoE runner backend `{moe_backend}`",
                f"{guess + ' ' if guess else ''}known: {', '.join(MOE_BACKENDS)}",
            )
        order = list(known)
        return cls(
            {n: resolved[n] for n in sorted(resolved, key=order.index)}, moe_backend, nvfp4_layers,
            precision,
        )

    @property
    def deployment(self) -> bool:
        return self.precision == "deployment"

    def describe(self) -> dict[str, Any]:
        return {
            "patches": dict(self.patches),
            "moe_backend": self.moe_backend,
            "nvfp4_layers": None if self.nvfp4_layers is None else sorted(self.nvfp4_layers),
            "precision": self.precision,
        }
