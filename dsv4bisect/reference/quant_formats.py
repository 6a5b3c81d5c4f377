"""DeepSeek-V4 weights as checkpoints store them: the quantised formats and the quantisation map.

Longer than 300 lines on purpose: the formats and the map that says which module uses which are
one topic, and both decoders and encoders sit next to the layouts they implement.

A weight `X.weight` is stored in one of these formats, told apart by its dtype and the sidecar
tensors next to it (`X.scale`, `X.weight_scale_inv`, `X.weight_scale`, `X.weight_scale_2`,
`X.input_scale`); R × C is the dequantised shape.

- `fp8-block`: float8_e4m3fn [R, C] with `X.scale` (DeepSeek: UE8M0 as float8_e8m0fnu or raw
  uint8 exponents, or fp32) or `X.weight_scale_inv` (fp32), [⌈R/128⌉, ⌈C/128⌉];
  value w · s[r // 128, c // 128];
- `fp8-tensor` / `fp8-channel`: float8_e4m3fn with `X.weight_scale` fp32 [] or [1] / [R] or
  [R, 1] (ModelOpt FP8); value w · s;
- `mxfp4`: int8 / uint8 [R, C/2] (or float4_e2m1fn_x2) with `X.scale` UE8M0 [R, C/32] (the
  DeepSeek-V4 routed experts); value e2m1 · 2^(b − 127);
- `nvfp4`: uint8 [R, C/2] (or float4_e2m1fn_x2) with `X.weight_scale` float8_e4m3fn [R, C/16],
  `X.weight_scale_2` fp32 [] (global) and optionally `X.input_scale` (the activations' global
  scale, unused for weights) — ModelOpt; value e2m1 · e4m3 · global;
- `bf16` / `fp16` / `fp32`: as is (upcast to fp32); `int` (e.g. `tid2eid`): int64.

E2M1 codes: two per byte, element 2i in the low nibble; bit 3 sign, magnitudes {0, 0.5, 1, 1.5, 2,
3, 4, 6} (OCP MX spec §5.3.3). E4M3: OCP FP8 E4M3 "fn" (bias 7, max 448, no infinities). UE8M0:
an unsigned 8-bit exponent, 2^(b−127), 255 = NaN.

The quantisation map (`QuantMap`) comes from the checkpoint's own files: `config.json`'s
`quantization_config` (DeepSeek: `quant_method fp8`, `fmt e4m3`, `scale_fmt ue8m0`,
`weight_block_size [128, 128]`; `expert_dtype fp4` for MXFP4 routed experts, top level or inside
it; or a ModelOpt block with `quant_method modelopt`) and ModelOpt's `hf_quant_config.json`
(`quantization.quant_algo` `NVFP4` with `exclude_modules` globs, or `MIXED_PRECISION` with
`quantized_layers` {module: {quant_algo}}). Globs match as SGLang's ModelOpt configs do (`*`
matches anything, dots included, full match) against the DeepSeek module name and its
Hugging Face / SGLang alias (`layers.3.ffn.experts.5.w1` ≡
`model.layers.3.mlp.experts.5.gate_proj`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from dsv4bisect.base.bounded import json_object, load_json
from dsv4bisect.errors import ConfigError
from dsv4bisect.kernels.nvfp4 import (
    E2M1_VALUES,
    NVFP4Tensor,
    e2m1_magnitude_code,
    nvfp4_dequantize,
    nvfp4_quantize,
)

FP8_BLOCK = 128  # DeepSeek's weight_block_size [128, 128]
MXFP4_GROUP = 32
NVFP4_GROUP = 16
E4M3_MAX = 448.0
SIDECARS = ("scale", "weight_scale_inv", "weight_scale", "weight_scale_2", "input_scale")
FLOAT_FORMATS = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
_FOUR_BIT = (torch.int8, torch.uint8, torch.float4_e2m1fn_x2)
_HINT = "the weight and its sidecars must follow one format (see docs/microtest.md, formats)"


# ---- sidecars and format detection ------------------------------------------------------------


def sidecar_names(name: str) -> dict[str, str]:
    """`X.weight` -> {role: `X.<role>`} for every sidecar role; {} for other names."""
    if not name.endswith(".weight"):
        return {}
    base = name[: -len(".weight")]
    return {role: f"{base}.{role}" for role in SIDECARS}


def classify(name: str, dtype: torch.dtype, shape: tuple[int, ...],
             sidecars: Mapping[str, tuple[torch.dtype, tuple[int, ...]]]) -> str:
    """The stored format of weight `name` from its dtype/shape and its sidecars' (role ->
    (dtype, shape)); ConfigError naming the tensors when they do not form a known format."""
    if dtype == torch.float8_e4m3fn:
        return _classify_fp8(name, shape, sidecars)
    if dtype in _FOUR_BIT and sidecars:
        return _classify_fp4(name, shape, sidecars)
    if dtype in FLOAT_FORMATS:
        if set(sidecars) - {"input_scale"}:
            raise ConfigError(f"`{name}` is {dtype} but has scale sidecars "
                              f"{sorted(set(sidecars) - {'input_scale'})}", _HINT)
        return FLOAT_FORMATS[dtype]
    if not dtype.is_floating_point and dtype != torch.bool and not sidecars:
        return "int"
    raise ConfigError(f"`{name}`: dtype {dtype} with sidecars {sorted(sidecars)} is no known "
                      "weight format", _HINT)


def _classify_fp8(name: str, shape: tuple[int, ...],
                  sc: Mapping[str, tuple[torch.dtype, tuple[int, ...]]]) -> str:
    blocks = tuple(math.ceil(n / FP8_BLOCK) for n in shape)
    for role in ("scale", "weight_scale_inv", "weight_scale"):
        if role not in sc:
            continue
        s_shape = tuple(sc[role][1])
        if len(shape) == 2 and s_shape == blocks:
            return "fp8-block"
        if role == "weight_scale" and s_shape in ((), (1,)):
            return "fp8-tensor"
        if role == "weight_scale" and s_shape in ((shape[0],), (shape[0], 1)):
            return "fp8-channel"
        raise ConfigError(f"`{name}`: FP8 scale `{role}` has shape {s_shape}; {FP8_BLOCK}x"
                          f"{FP8_BLOCK} blocks of {shape} need {blocks}", _HINT)
    raise ConfigError(f"`{name}` is FP8 but has no scale (`.scale`, `.weight_scale_inv` or "
                      "`.weight_scale`)", _HINT)


def _classify_fp4(name: str, shape: tuple[int, ...],
                  sc: Mapping[str, tuple[torch.dtype, tuple[int, ...]]]) -> str:
    base = name[: -len(".weight")]
    if "weight_scale" in sc and sc["weight_scale"][0] == torch.float8_e4m3fn:
        if "weight_scale_2" not in sc:
            raise ConfigError(f"`{base}.weight_scale_2` (the NVFP4 global scale of `{name}`) "
                              "is missing", _HINT)
        fmt, group = "nvfp4", NVFP4_GROUP
        s_shape = tuple(sc["weight_scale"][1])
    elif "scale" in sc:
        fmt, group = "mxfp4", MXFP4_GROUP
        s_shape = tuple(sc["scale"][1])
    else:
        raise ConfigError(f"`{name}` is packed 4-bit but has no `.scale` (MXFP4) or E4M3 "
                          "`.weight_scale` (NVFP4)", _HINT)
    n_in = 2 * shape[-1]
    if len(shape) != 2 or s_shape != (shape[0], n_in // group) or n_in % group:
        raise ConfigError(f"`{name}`: {fmt} scale shape {s_shape} does not match {shape[0]} x "
                          f"{n_in} values in groups of {group}", _HINT)
    return fmt


# ---- decoders ---------------------------------------------------------------------------------


def ue8m0_values(scale: torch.Tensor) -> torch.Tensor:
    """UE8M0 scales (float8_e8m0fnu, or raw uint8 exponents 2^(b-127)) or plain floats -> fp32."""
    if scale.dtype == torch.uint8:
        bits = scale.float()
        return torch.where(bits == 255, float("nan"), torch.exp2(bits - 127.0))
    return scale.float()


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """[R, C/2] bytes (int8, uint8 or float4_e2m1fn_x2) -> [R, C] fp32 E2M1 values."""
    codes = packed.view(torch.uint8)
    lut = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), device=codes.device)
    pairs = torch.stack((codes & 0x0F, codes >> 4), dim=-1).long()  # element 2i low nibble
    return lut[pairs].flatten(-2)


def dequantize(name: str, fmt: str, w: torch.Tensor,
               sidecars: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The fp32 value of weight `name` stored as `fmt` (from `classify`) with its sidecars."""
    if fmt == "fp8-block":
        s = ue8m0_values(sidecars.get("scale", sidecars.get("weight_scale_inv",
                                                             sidecars.get("weight_scale"))))
        return fp8_block_dequantize(w, s)
    if fmt in ("fp8-tensor", "fp8-channel"):
        s = sidecars["weight_scale"].float().reshape(-1, 1) if fmt == "fp8-channel" else \
            sidecars["weight_scale"].float().reshape(())
        return w.float() * s
    if fmt == "mxfp4":
        vals = unpack_e2m1(w)
        s = ue8m0_values(sidecars["scale"])
        return (vals.view(vals.shape[0], s.shape[1], -1) * s[..., None]).view(vals.shape)
    if fmt == "nvfp4":
        codes = w.view(torch.uint8)
        shape = torch.Size((codes.shape[0], 2 * codes.shape[1]))
        g = sidecars["weight_scale_2"].float().reshape(())
        return nvfp4_dequantize(NVFP4Tensor(codes, sidecars["weight_scale"], g, shape))
    if fmt == "int":
        return w.long()
    if fmt in FLOAT_FORMATS.values():
        return w.float()
    raise ConfigError(f"`{name}`: unknown stored format `{fmt}`", _HINT)


def fp8_block_dequantize(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """w [R, C] E4M3 · s [⌈R/128⌉, ⌈C/128⌉] broadcast over 128 x 128 blocks -> fp32 [R, C]."""
    rows, cols = w.shape
    if rows % FP8_BLOCK == 0 and cols % FP8_BLOCK == 0:  # broadcast over [R/128, 128, C/128, 128]
        blocks = w.float().view(rows // FP8_BLOCK, FP8_BLOCK, cols // FP8_BLOCK, FP8_BLOCK)
        return (blocks * s[:, None, :, None]).view(rows, cols)
    full = s.repeat_interleave(FP8_BLOCK, 0)[:rows].repeat_interleave(FP8_BLOCK, 1)[:, :cols]
    return w.float() * full


# ---- encoders (synthetic checkpoints, hand-made slices, tests) ----------------------------------


def quantize_fp8_block(
    w: torch.Tensor, scale_fmt: str = "ue8m0"
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 [R, C] -> (float8_e4m3fn [R, C], scale [⌈R/128⌉, ⌈C/128⌉]): UE8M0 scales are the
    power of two at or above block amax / 448 (float8_e8m0fnu), fp32 scales amax / 448."""
    rows, cols = w.shape
    pad = (0, -cols % FP8_BLOCK, 0, -rows % FP8_BLOCK)
    blocks = F.pad(w.float(), pad).unflatten(0, (-1, FP8_BLOCK)).unflatten(2, (-1, FP8_BLOCK))
    amax = blocks.abs().amax((1, 3)).clamp(min=1e-30)  # [R/128, C/128]
    if scale_fmt == "ue8m0":
        scale = torch.exp2(torch.ceil(torch.log2(amax / E4M3_MAX)))
    elif scale_fmt == "fp32":
        scale = amax / E4M3_MAX
    else:
        raise ValueError(f"scale_fmt must be ue8m0 or fp32, got {scale_fmt!r}")
    full = scale.repeat_interleave(FP8_BLOCK, 0)[:rows].repeat_interleave(FP8_BLOCK, 1)[:, :cols]
    q = (w.float() / full).to(torch.float8_e4m3fn)
    return q, scale.to(torch.float8_e8m0fnu) if scale_fmt == "ue8m0" else scale


def quantize_fp8_tensor(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 -> (float8_e4m3fn, fp32 scalar scale amax / 448): ModelOpt per-tensor FP8."""
    scale = (w.float().abs().amax().clamp(min=1e-30) / E4M3_MAX).reshape(())
    return (w.float() / scale).to(torch.float8_e4m3fn), scale


def pack_e2m1(v: torch.Tensor) -> torch.Tensor:
    """Scaled values [R, C] -> nearest E2M1 codes (ties to even, saturating at ±6), packed two
    per byte, element 2i in the low nibble: uint8 [R, C/2]."""
    code = e2m1_magnitude_code(v.abs()) | ((v < 0).to(torch.uint8) << 3)
    pairs = code.unflatten(-1, (-1, 2))
    return (pairs[..., 0] | (pairs[..., 1] << 4)).contiguous()


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 [R, C] -> (uint8 codes [R, C/2], float8_e8m0fnu scale [R, C/32]); the scale is the
    power of two at or above group amax / 6, so every value fits the E2M1 range."""
    groups = w.float().unflatten(1, (-1, MXFP4_GROUP))  # [R, C/32, 32]
    amax = groups.abs().amax(-1).clamp(min=1e-30)
    scale = torch.exp2(torch.ceil(torch.log2(amax / 6.0)))
    codes = pack_e2m1((groups / scale[..., None]).flatten(1))
    return codes, scale.to(torch.float8_e8m0fnu)


def quantize_nvfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 [R, C] -> ModelOpt NVFP4 (uint8 codes [R, C/2], float8_e4m3fn weight_scale
    [R, C/16], fp32 weight_scale_2 = amax / (6 · 448))."""
    q = nvfp4_quantize(w.float())
    return q.codes, q.scales, q.global_scale.reshape(())


def encode(name: str, w: torch.Tensor, fmt: str) -> dict[str, torch.Tensor]:
    """The tensors a checkpoint holds for weight `name` (fp32 value `w`) stored as `fmt`."""
    base = name.removesuffix(".weight")
    if fmt in ("fp8-block", "fp8-block-fp32"):
        q, s = quantize_fp8_block(w, "fp32" if fmt.endswith("fp32") else "ue8m0")
        role = "weight_scale_inv" if fmt.endswith("fp32") else "scale"
        return {name: q, f"{base}.{role}": s}
    if fmt == "fp8-tensor":
        q, s = quantize_fp8_tensor(w)
        return {name: q, f"{base}.weight_scale": s}
    if fmt == "mxfp4":
        q, s = quantize_mxfp4(w)
        return {name: q.view(torch.int8), f"{base}.scale": s}
    if fmt == "nvfp4":
        q, s, g = quantize_nvfp4(w)
        act = torch.tensor(1.0 / (6.0 * E4M3_MAX))  # a calibrated activation amax of 1
        return {name: q, f"{base}.weight_scale": s, f"{base}.weight_scale_2": g,
                f"{base}.input_scale": act}
    dtypes = {v: k for k, v in FLOAT_FORMATS.items()}
    if fmt in dtypes:
        return {name: w.to(dtypes[fmt])}
    raise ValueError(f"unknown format {fmt!r}")


# ---- the quantisation map ---------------------------------------------------------------------

CONFIG_NAME = "config.json"
HF_QUANT_NAME = "hf_quant_config.json"
_NVFP4_ALGOS = ("NVFP4", "W4A16_NVFP4")
_ALGO_FORMAT = {"NVFP4": "nvfp4", "W4A16_NVFP4": "nvfp4", "FP8": "fp8",
                "FP8_PB_WO": "fp8", "MXFP4": "mxfp4"}
_ALIASES = ((r"^layers\.", "model.layers."), (r"\.ffn\.experts\.", ".mlp.experts."),
            (r"\.ffn\.shared_experts\.", ".mlp.shared_experts."), (r"\.ffn\.gate$", ".mlp.gate"),
            (r"\.ffn\.experts$", ".mlp.experts"), (r"\.attn\.", ".self_attn."),
            (r"\.w1$", ".gate_proj"), (r"\.w3$", ".up_proj"), (r"\.w2$", ".down_proj"),
            (r"^head$", "lm_head"), (r"^embed$", "model.embed_tokens"))


def module_aliases(module: str) -> tuple[str, ...]:
    """A DeepSeek module name and its Hugging Face / SGLang spelling."""
    alias = module
    for pattern, repl in _ALIASES:
        alias = re.sub(pattern, repl, alias)
    return (module,) if alias == module else (module, alias)


def _glob_match(pattern: str, name: str) -> bool:
    return re.fullmatch(re.escape(pattern).replace(r"\*", ".*"), name) is not None


@dataclass(frozen=True)
class QuantMap:
    """How the checkpoint's config files say each module is stored (see the module docstring).

    `declared(module)` is one of `nvfp4`, `fp8`, `mxfp4`, `dense` (unquantised, or the base
    `quantization_config` where the tensors decide), and `config_class` the SGLang config class
    that would dispatch: `fp8`, `modelopt_fp4`, `modelopt_mixed`, `modelopt_fp8` or `none`.
    """

    base: str = "none"  # config.json quantization_config: fp8 | none
    expert_dtype: str | None = None  # DeepSeek `expert_dtype` (fp4 -> MXFP4 routed experts)
    algo: str | None = None  # ModelOpt quant_algo
    group_size: int | None = None
    exclude: tuple[str, ...] = ()
    layers: Mapping[str, str] = field(default_factory=dict)  # MIXED_PRECISION: module -> algo
    sources: tuple[str, ...] = ()

    @property
    def config_class(self) -> str:
        if self.algo == "MIXED_PRECISION":
            return "modelopt_mixed"
        if self.algo in _NVFP4_ALGOS:
            return "modelopt_fp4"
        if self.algo is not None:
            return "modelopt_fp8"
        return "fp8" if self.base == "fp8" else "none"

    @classmethod
    def load(cls, directory: str | Path | None) -> QuantMap:
        """Read config.json's `quantization_config` and hf_quant_config.json (when present)."""
        if directory is None:
            return cls()
        d = Path(directory)
        cfg = _read_json(d / CONFIG_NAME) or {}
        qc = cfg.get("quantization_config") or {}
        if not isinstance(qc, Mapping):
            raise ConfigError(f"{d / CONFIG_NAME}: `quantization_config` must be an object", _HINT)
        sources = [CONFIG_NAME] if qc else []
        expert = qc.get("expert_dtype", cfg.get("expert_dtype"))
        base = "fp8" if qc.get("quant_method") == "fp8" or qc.get("fmt") == "e4m3" else "none"
        modelopt: Mapping[str, Any] = qc if qc.get("quant_method") == "modelopt" else {}
        hf = _read_json(d / HF_QUANT_NAME)
        if hf is not None:
            sources.append(HF_QUANT_NAME)
            modelopt = hf.get("quantization", hf)
        return cls(base, expert, *_modelopt_fields(modelopt, d), sources=tuple(sources))

    def declared(self, module: str) -> str:
        """How the config files say `module` (e.g. `layers.3.ffn.experts.5.w1`) is stored."""
        names = module_aliases(module)
        if self.algo == "MIXED_PRECISION":
            for key, algo in self.layers.items():
                if any(key == n or key.startswith(n + ".") or _glob_match(key, n) for n in names):
                    return _ALGO_FORMAT.get(algo.upper(), "dense")
            return self._base(module)
        if self.algo is not None:
            if any(_glob_match(p, n) for p in self.exclude for n in names):
                return self._base(module)
            return _ALGO_FORMAT.get(self.algo, "dense")
        return self._base(module)

    def _base(self, module: str) -> str:
        routed = ".experts." in module + "." and ".shared_experts" not in module
        if routed and self.expert_dtype in ("fp4", "mxfp4"):
            return "mxfp4"
        return "fp8" if self.base == "fp8" else "dense"

    def describe(self) -> dict[str, Any]:
        return {"config_class": self.config_class, "base": self.base,
                "expert_dtype": self.expert_dtype, "quant_algo": self.algo,
                "group_size": self.group_size, "exclude_modules": list(self.exclude),
                "quantized_layers": len(self.layers), "sources": list(self.sources)}


def _modelopt_fields(q: Mapping[str, Any], d: Path) -> tuple[Any, ...]:
    if not q:
        return None, None, (), {}
    algo = q.get("quant_algo")
    if not isinstance(algo, str):
        raise ConfigError(f"{d}: the ModelOpt quantization config has no `quant_algo`", _HINT)
    exclude = q.get("exclude_modules", q.get("ignore")) or []
    layers = q.get("quantized_layers") or {}
    if not isinstance(exclude, list) or not isinstance(layers, Mapping):
        raise ConfigError(f"{d}: `exclude_modules` must be a list and `quantized_layers` an "
                          "object", _HINT)
    per_module = {k: str(v.get("quant_algo", "")) if isinstance(v, Mapping) else str(v)
                  for k, v in layers.items()}
    return algo.upper(), q.get("group_size"), tuple(map(str, exclude)), per_module


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    return json_object(load_json(path, "checkpoint-config"), str(path), "a JSON object", _HINT)
