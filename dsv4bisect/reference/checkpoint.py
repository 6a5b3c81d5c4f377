"""Checkpoints as DeepSeek ships them: a directory with `config.json` (Hugging Face DeepSeek-V4
fields) and safetensors shards under DeepSeek's tensor names, plus `model.safetensors.index.json`.

- `CheckpointReader` reads tensors lazily by name (`safe_open`, one shard header at a time; never a
  whole file) from one file or sharded shards. `get_weight` dequantises the stored formats to
  fp32 (`quant_formats`): FP8-E4M3 with 128x128 block scales (UE8M0 or fp32) or ModelOpt
  per-tensor scales, MXFP4 experts (E2M1 + a UE8M0 scale per 32), NVFP4 (E2M1 + an E4M3 scale
  per 16 + an fp32 global scale, ModelOpt layout).
- `save_checkpoint` writes config.json, shards of at most `max_shard_bytes` and the index.
- `init_module` / `random_model` give a deterministic random model from a seed (each tensor from
  its own generator seeded by (seed, name), so one layer initialises identically alone or whole).
- `load_into` / `load_model` / `load_layer` fill a model, or one layer of any config (a real
  `flash` layer from a directory slice, optionally with a subset of experts); unknown, missing or
  misshapen tensors are `ConfigError`s that name them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from dsv4bisect.base.bounded import json_object, load_json
from dsv4bisect.config.checkpoints import load_weight_map
from dsv4bisect.errors import ConfigError
from dsv4bisect.reference import mtp as mtp_file
from dsv4bisect.reference import quant_formats
from dsv4bisect.reference.config import ModelArgs
from dsv4bisect.reference.model import Block, Transformer, build_block, build_model

CONFIG_NAME = "config.json"
INDEX_NAME = "model.safetensors.index.json"
FP8_BLOCK = 128  # DeepSeek's weight_block_size [128, 128]
FP4_GROUP = 32  # MXFP4 experts: one UE8M0 scale per 32 values
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_HINT = "a DeepSeek-V4 checkpoint is a directory with config.json and *.safetensors shards"
_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "F8_E8M0": torch.float8_e8m0fnu, "F4": torch.float4_e2m1fn_x2, "I64": torch.int64,
    "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}


def read_config(path: str | Path) -> ModelArgs:
    """ModelArgs from `<dir>/config.json` (ConfigError with the file name when invalid)."""
    file = Path(path) / CONFIG_NAME if Path(path).is_dir() else Path(path)
    if not file.is_file():
        raise ConfigError(f"no {CONFIG_NAME} in {Path(path)}", _HINT)
    data = json_object(load_json(file, "checkpoint-config"), str(file), "a model config", _HINT)
    return ModelArgs.from_hf_config(data, source=str(file))


class CheckpointReader:
    """Lazy, by-name access to the tensors of a checkpoint directory or one safetensors file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise ConfigError(f"checkpoint {self.path} does not exist", _HINT)
        self._files: dict[Path, object] = {}
        self._where = self._index()

    def _index(self) -> dict[str, Path]:
        if self.path.is_file():
            return {name: self.path for name in self._handle(self.path).keys()}
        index = self.path / INDEX_NAME
        if index.exists():  # bounded, and shards only inside the directory
            return {name: self.path / file for name, file in load_weight_map(self.path).items()}
        shards = sorted(self.path.glob("*.safetensors"))
        if not shards:
            raise ConfigError(f"no *.safetensors in {self.path}", _HINT)
        return {name: shard for shard in shards for name in self._handle(shard).keys()}

    def _handle(self, file: Path) -> Any:  # safetensors' handle type is private
        if file not in self._files:
            if not file.exists():
                raise ConfigError(f"shard {file.name} listed in {INDEX_NAME} is missing", _HINT)
            self._files[file] = safe_open(str(file), framework="pt", device="cpu")
        return self._files[file]

    @property
    def config(self) -> ModelArgs:
        return read_config(self.path if self.path.is_dir() else self.path.parent)

    def names(self) -> list[str]:
        return sorted(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handle(self._file(name)).get_slice(name).get_shape())

    def get(self, name: str) -> torch.Tensor:
        """The tensor as stored."""
        return self._handle(self._file(name)).get_tensor(name)

    def dtype(self, name: str) -> torch.dtype:
        """The stored dtype of `name`, from the shard header (no tensor data is read)."""
        code = self._handle(self._file(name)).get_slice(name).get_dtype()
        return _SAFETENSORS_DTYPES[code]

    def stored_format(self, name: str) -> str:
        """How `name` is stored (`fp8-block`, `mxfp4`, `nvfp4`, `bf16`, ...; see
        `quant_formats`), from headers only."""
        sidecars = {role: (self.dtype(n), self.shape(n))
                    for role, n in quant_formats.sidecar_names(name).items() if n in self}
        return quant_formats.classify(name, self.dtype(name), self.shape(name), sidecars)

    def get_weight(self, name: str) -> torch.Tensor:
        """The tensor as the model uses it: fp32 (dequantised from FP8 / MXFP4 / NVFP4 with its
        sidecars when stored so, see `quant_formats`), integers as int64."""
        fmt = self.stored_format(name)
        sidecars = {role: self.get(n) for role, n in quant_formats.sidecar_names(name).items()
                    if n in self and role != "input_scale"}
        return quant_formats.dequantize(name, fmt, self.get(name), sidecars)

    def _file(self, name: str) -> Path:
        if name not in self._where:
            raise ConfigError(f"tensor `{name}` is not in checkpoint {self.path}", _HINT)
        return self._where[name]

    def close(self) -> None:
        self._files.clear()

    def __enter__(self) -> CheckpointReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- DeepSeek storage formats -------------------------------------------------------------------


def to_deepseek_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 [out, in] -> (float8_e4m3fn weight, float8_e8m0fnu scale per 128x128 block), the
    format of DeepSeek-V4's dense weights (power-of-two scales, block amax <= 448)."""
    rows, cols = w.shape
    pad = (0, -cols % FP8_BLOCK, 0, -rows % FP8_BLOCK)
    blocks = (
        nn.functional.pad(w.float(), pad)
        .unflatten(0, (-1, FP8_BLOCK))
        .unflatten(2, (-1, FP8_BLOCK))
    )
    amax = blocks.abs().amax((1, 3)).clamp(min=1e-30)  # [rows/128, cols/128]
    scale = torch.exp2(torch.ceil(torch.log2(amax / 448.0)))
    full = scale.repeat_interleave(FP8_BLOCK, 0)[:rows].repeat_interleave(FP8_BLOCK, 1)[:, :cols]
    return (w.float() / full).to(torch.float8_e4m3fn), scale.to(torch.float8_e8m0fnu)


def to_deepseek_fp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 [out, in] -> (int8 [out, in/2] packed E2M1 codes, float8_e8m0fnu scale [out, in/32]),
    the format of DeepSeek-V4's MXFP4 routed experts (nearest grid value, low nibble first)."""
    groups = w.float().unflatten(1, (-1, FP4_GROUP))  # [out, in/32, 32]
    amax = groups.abs().amax(-1).clamp(min=1e-30)
    scale = torch.exp2(torch.ceil(torch.log2(amax / 6.0)))  # largest value maps to <= 6
    v = groups / scale[..., None]
    midpoints = torch.tensor([(a + b) / 2 for a, b in pairwise(_E2M1)])
    mag = torch.bucketize(v.abs(), midpoints).to(torch.uint8)  # nearest code 0..7
    codes = (mag | ((v < 0).to(torch.uint8) << 3)).flatten(1).unflatten(1, (-1, 2))
    packed = (codes[..., 0] | (codes[..., 1] << 4)).view(torch.int8)
    return packed, scale.to(torch.float8_e8m0fnu)


# ---- save ---------------------------------------------------------------------------------------


def save_checkpoint(
    directory: str | Path,
    args: ModelArgs,
    tensors: Mapping[str, torch.Tensor],
    *,
    max_shard_bytes: int = 2 << 30,
) -> list[Path]:
    """Write config.json, `model-0000i-of-0000N.safetensors` shards and the index."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_NAME).write_text(json.dumps(args.to_hf_config(), indent=2) + "\n")
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous().clone()
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    files, weight_map = [], {}
    for i, shard in enumerate(shards, 1):
        file = out / f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(file), metadata={"format": "pt"})
        files.append(file)
        weight_map.update({name: file.name for name in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    return files


# ---- deterministic random init ------------------------------------------------------------------

# Gains over fan_in^-0.5. Expert gate/up weights are wider so that a few pre-activations pass
# swiglu_limit (the clamp is active, as in the trained model); the head is sharper so greedy
# choices are not near-ties.
EXPERT_UP_GAIN = 4.0
HEAD_GAIN = 2.0


def _generator(seed: int, name: str) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def init_tensor(name: str, shape: Sequence[int], args: ModelArgs, seed: int) -> torch.Tensor:
    """The deterministic initial value of tensor `name` (depends only on seed, name and shape)."""
    g = _generator(seed, name)
    leaf = name.rsplit(".", 1)[-1]

    def normal(std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std

    if leaf == "tid2eid":  # distinct experts per token
        return torch.rand(shape[0], args.n_routed_experts, generator=g).argsort(-1)[:, : shape[1]]
    if name.endswith("norm.weight"):
        return torch.ones(*shape)
    if leaf == "attn_sink" or leaf == "ape":
        return normal(0.5)
    if leaf.startswith("hc_") and leaf.endswith("_fn"):
        return normal(shape[1] ** -0.5)
    if leaf.startswith("hc_") and leaf.endswith("_scale"):
        return torch.ones(*shape)
    if leaf.startswith("hc_") and leaf.endswith("_base"):
        base = torch.zeros(*shape)
        n = args.hc_mult
        if shape[0] == (2 + n) * n:  # favour keeping each stream in place in the comb mixing
            base[2 * n :] = torch.eye(n).flatten()
        return base
    if name.endswith("gate.bias"):
        return normal(0.1)
    if name == "embed.weight":
        return normal(1.0)
    if name == "head.weight":
        return normal(HEAD_GAIN * shape[1] ** -0.5)
    if name.endswith(("w1.weight", "w3.weight")) and "experts" in name:
        return normal(EXPERT_UP_GAIN * shape[1] ** -0.5)
    if name.endswith("w2.weight") and "experts" in name:  # keep the expert output near unit scale
        return normal(shape[1] ** -0.5 / EXPERT_UP_GAIN)
    if len(shape) == 2:
        return normal(shape[1] ** -0.5)
    raise ValueError(f"no init rule for tensor {name} {tuple(shape)}")


def init_module(module: nn.Module, args: ModelArgs, seed: int = 0, *, prefix: str = "") -> None:
    """Fill every parameter and buffer of `module` (names under `prefix`) from the seed."""
    with torch.no_grad():
        for local, t in module.state_dict(keep_vars=True).items():
            t.copy_(init_tensor(prefix + local, t.shape, args, seed).to(t.dtype))


def random_model(args: ModelArgs, seed: int = 0, device: torch.device | str = "cpu") -> Transformer:
    model = build_model(args, device)
    init_module(model, args, seed)
    return model


def state_tensors(module: nn.Module, *, prefix: str = "") -> dict[str, torch.Tensor]:
    """The module's tensors under their checkpoint names."""
    return {prefix + k: v.detach() for k, v in module.state_dict().items()}


# ---- load ---------------------------------------------------------------------------------------


def load_into(
    module: nn.Module,
    reader: CheckpointReader,
    *,
    prefix: str = "",
    reject_unknown: bool = True,
) -> None:
    """Copy the checkpoint's tensors named `prefix + <state_dict name>` into `module`.

    Missing and misshapen tensors are ConfigErrors; so are unknown tensors (names the module does
    not have; `.scale` sidecars of loaded weights excepted) when `reject_unknown`.
    """
    expected = module.state_dict(keep_vars=True)
    available = set(reader.names())
    missing = [prefix + k for k in expected if prefix + k not in available]
    if missing:
        raise ConfigError(
            f"checkpoint {reader.path} lacks {len(missing)} tensor(s) the model needs: "
            f"{_listing(missing)}",
            "the config.json does not match the shards (layer count, ratios, experts?)",
        )
    if reject_unknown:
        known = {prefix + k for k in expected}
        sidecars = {side for n in known for side in quant_formats.sidecar_names(n).values()}
        unknown = sorted(n for n in available if n.startswith(prefix) and n not in known | sidecars)
        if unknown:
            raise ConfigError(
                f"checkpoint {reader.path} has {len(unknown)} tensor(s) the model does not: "
                f"{_listing(unknown)}",
                "check config.json (num_hidden_layers, compress_ratios, num_hash_layers, "
                "n_routed_experts, num_nextn_predict_layers) against the shards",
            )
    with torch.no_grad():
        for local, target in expected.items():
            value = reader.get_weight(prefix + local)
            if tuple(value.shape) != tuple(target.shape):
                raise ConfigError(
                    f"tensor `{prefix + local}` has shape {tuple(value.shape)}, the config "
                    f"implies {tuple(target.shape)}",
                    "config.json and the shards disagree",
                )
            target.copy_(value.to(target.dtype))


def _listing(names: Iterable[str], limit: int = 8) -> str:
    names = list(names)
    more = f" (+{len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _config_of(path: str | Path) -> ModelArgs:
    """The config of a checkpoint directory (or of the directory holding one .safetensors)."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"checkpoint {p} does not exist", _HINT)
    return read_config(p if p.is_dir() else p.parent)


def load_model(path: str | Path, device: torch.device | str = "cpu", *,
               mtp: bool = False) -> Transformer:
    """Build the model `config.json` describes and load every tensor (strict).

    `mtp=True` also loads the MTP layer kept beside the checkpoint (`mtp.json` +
    `mtp.safetensors`, see `reference/mtp.py`): the model then has `num_nextn_predict_layers`
    from `mtp.json`; a ConfigError when the directory has none. A checkpoint whose own
    config.json already declares MTP layers has them in its shards and loads them either way."""
    args = _config_of(path)
    extra = None
    if mtp and args.num_nextn_predict_layers == 0:
        directory = Path(path) if Path(path).is_dir() else Path(path).parent
        extra = directory / mtp_file.MTP_WEIGHTS_NAME
        args = mtp_file.with_mtp(args, mtp_file.read_mtp_config(directory))
    model = build_model(args, device)
    with CheckpointReader(path) as reader:
        if extra is None:
            load_into(model, reader)
            model.stored_formats, model.nvfp4_scales = stored_formats(reader, model.state_dict())
            return model
        blocks, model.mtp = model.mtp, nn.ModuleList()  # the main shards hold no MTP tensors
        load_into(model, reader)
        model.mtp = blocks
        main_formats = stored_formats(reader, state_tensors(model).keys() - _mtp_names(model))
    with CheckpointReader(extra) as reader:
        load_into(model.mtp, reader, prefix="mtp.")
        formats, scales = stored_formats(reader, _mtp_names(model))
    model.stored_formats, model.nvfp4_scales = {**main_formats[0], **formats}, \
        {**main_formats[1], **scales}
    return model


def _mtp_names(model: Transformer) -> set[str]:
    return {"mtp." + k for k in model.mtp.state_dict()}


def stored_formats(
    reader: CheckpointReader, names: Iterable[str]
) -> tuple[dict[str, str], dict[str, tuple[float, float | None]]]:
    """How the checkpoint stores each weight of `names` (headers only), and for each one stored
    in NVFP4 its fp32 global scale `weight_scale_2` and static activation scale `input_scale`
    (None when the checkpoint has none)."""
    formats = {n: reader.stored_format(n) for n in names if n.endswith(".weight")}
    scales: dict[str, tuple[float, float | None]] = {}
    for n, fmt in formats.items():
        if fmt == "nvfp4":
            side = quant_formats.sidecar_names(n)
            act = float(reader.get(side["input_scale"]).reshape(())) \
                if side["input_scale"] in reader else None
            scales[n] = (float(reader.get(side["weight_scale_2"]).reshape(())), act)
    return formats, scales


def load_layer(
    path: str | Path,
    layer: int,
    *,
    expert_ids: Sequence[int] | None = None,
    device: torch.device | str = "cpu",
) -> Block:
    """Build decoder layer `layer` of the checkpoint's config (e.g. a real `flash` layer) and load
    `layers.<layer>.*` from the directory, which may hold only that slice. `expert_ids` builds and
    loads only those routed experts (None: all)."""
    args = _config_of(path)
    with CheckpointReader(path) as reader:
        if not 0 <= layer < args.num_hidden_layers:
            raise ConfigError(f"layer {layer} out of range (0..{args.num_hidden_layers - 1})",
                              "pick a layer the checkpoint has")
        block = build_block(args, layer, expert_ids=expert_ids, device=device)
        load_into(block, reader, prefix=f"layers.{layer}.", reject_unknown=expert_ids is None)
    return block
