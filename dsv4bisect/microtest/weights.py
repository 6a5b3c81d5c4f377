"""The tensors a micro-test reads: by name, lazily, dequantised to fp32 on the chosen device.

`WeightSource.open("random")` is the seed-0 random `tiny` model (each tensor from its own
generator, exactly as the embedded engine initialises it), `"embedded"` the shipped checkpoint,
anything else a checkpoint directory. A directory is read through `CheckpointReader`: shard
headers, then only the tensors a check asks for (a 150+ GB checkpoint is never read whole).
Every name read is recorded in `reads`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cached_property
from pathlib import Path

import torch

from dsv4bisect.config.checkpoints import checkpoint_dir
from dsv4bisect.errors import ConfigError
from dsv4bisect.reference.checkpoint import CheckpointReader, init_tensor, read_config
from dsv4bisect.reference.config import ModelArgs
from dsv4bisect.reference.model import build_block
from dsv4bisect.reference.quant_formats import QuantMap

RANDOM_SEED = 0
_EXPERT = re.compile(r"layers\.(\d+)\.ffn\.experts\.(\d+)\.")


class WeightSource:
    """Named fp32 tensors of one checkpoint (or of the random tiny model)."""

    def __init__(self, label: str, args: ModelArgs, reader: CheckpointReader | None,
                 quant: QuantMap, device: torch.device) -> None:
        self.label, self.args, self.quant, self.device = label, args, quant, device
        self._reader = reader
        self._cache: dict[str, torch.Tensor] = {}
        self.reads: list[str] = []

    @classmethod
    def open(cls, checkpoint: str, device: torch.device) -> WeightSource:
        directory = checkpoint_dir(checkpoint)
        if directory is None:
            return cls("random (tiny, seed 0)", ModelArgs.preset("tiny"), None, QuantMap(), device)
        path = Path(directory)
        return cls(str(path), read_config(path), CheckpointReader(path), QuantMap.load(path),
                   device)

    # ---- names ------------------------------------------------------------------------------
    @cached_property
    def _random_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes: dict[str, tuple[int, ...]] = {}
        for layer in range(self.args.num_hidden_layers):
            block = build_block(self.args, layer, device="meta")
            shapes.update({f"layers.{layer}.{k}": tuple(v.shape)
                           for k, v in block.state_dict().items()})
        return shapes

    def has(self, name: str) -> bool:
        return name in self._random_shapes if self._reader is None else name in self._reader

    def require(self, names: Iterable[str], why: str) -> None:
        """ConfigError naming every tensor in `names` the checkpoint lacks."""
        missing = sorted({n for n in names if not self.has(n)})
        if missing:
            listing = ", ".join(missing[:10]) + (f" (+{len(missing) - 10} more)"
                                                  if len(missing) > 10 else "")
            raise ConfigError(f"checkpoint {self.label} lacks {len(missing)} tensor(s) {why}: "
                              f"{listing}", "check the checkpoint's shards and index, or choose "
                              "other --layers / patches")

    @cached_property
    def _experts(self) -> dict[int, list[int]]:
        if self._reader is None:
            ids = list(range(self.args.n_routed_experts))
            return dict.fromkeys(range(self.args.num_hidden_layers), ids)
        found: dict[int, set[int]] = {}
        for name in self._reader.names():
            m = _EXPERT.match(name)
            if m:
                found.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
        return {layer: sorted(ids) for layer, ids in found.items()}

    def expert_ids(self, layer: int) -> list[int]:
        """The routed experts of `layer` the checkpoint holds (a slice may hold a few)."""
        return self._experts.get(layer, [])

    def sample_experts(self, layer: int, n: int) -> list[int]:
        """`n` held experts of `layer`, evenly spread over the ids."""
        ids = self.expert_ids(layer)
        if len(ids) <= n:
            return ids
        return [ids[round(i * (len(ids) - 1) / max(1, n - 1))] for i in range(n)]

    # ---- values -----------------------------------------------------------------------------
    def stored_format(self, name: str) -> str:
        """`fp8-block`, `mxfp4`, `nvfp4`, `bf16`, `fp32`, `int`, ... (headers only)."""
        if self._reader is None:
            return "int" if name.endswith("tid2eid") else "fp32"
        return self._reader.stored_format(name)

    def get(self, name: str) -> torch.Tensor:
        """fp32 (integers: int64) on the device; kept until `release()`."""
        if name not in self._cache:
            self.require([name], "a check reads")
            self.reads.append(name)
            if self._reader is None:
                t = init_tensor(name, self._random_shapes[name], self.args, RANDOM_SEED)
            else:
                t = self._reader.get_weight(name)
            self._cache[name] = t.to(self.device)
        return self._cache[name]

    def get_stored(self, name: str) -> torch.Tensor:
        """The tensor as stored (e.g. an NVFP4 `input_scale`), on the device."""
        self.require([name], "a check reads")
        self.reads.append(name)
        if self._reader is None:
            return self.get(name)
        return self._reader.get(name).to(self.device)

    def release(self) -> None:
        """Drop cached tensors (called after each layer: a Flash layer is ~1 GB in fp32)."""
        self._cache.clear()

    def close(self) -> None:
        self.release()
        if self._reader is not None:
            self._reader.close()
