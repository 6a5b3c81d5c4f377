"""Where the embedded engine's weights come from (`embedded`, `random`, or a directory), and the
bounded readers of a checkpoint's config.json and shard index (`load_checkpoint_config`,
`load_weight_map`) that every reader of a checkpoint should use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dsv4bisect.base.bounded import json_object, load_json
from dsv4bisect.errors import ConfigError

# The trained checkpoint shipped inside the package (config.json + safetensors shards).
EMBEDDED_CHECKPOINT = Path(__file__).resolve().parents[1] / "reference" / "weights"


def checkpoint_dir(name: str) -> Path | None:
    """`random` → None (the seed-0 random tiny model); `embedded` → the shipped checkpoint."""
    if name == "random":
        return None
    path = EMBEDDED_CHECKPOINT if name == "embedded" else Path(name).expanduser()
    if not (path / "config.json").is_file():
        what = "the embedded checkpoint is not installed" if name == "embedded" else \
            f"checkpoint directory `{name}` has no config.json"
        raise ConfigError(what, "pass a DeepSeek-format checkpoint directory, or `random` for "
                                "the random tiny model")
    return path


CONFIG_NAME = "config.json"
INDEX_NAME = "model.safetensors.index.json"
_CKPT_HINT = "pass a DeepSeek-format checkpoint directory (config.json + safetensors shards)"


def load_checkpoint_config(directory: Path) -> dict[str, Any]:
    """A checkpoint's config.json through the bounded loader (a JSON object, else an error)."""
    path = directory / CONFIG_NAME
    return json_object(load_json(path, "checkpoint-config"), str(path), "a model config",
                       _CKPT_HINT)


def load_weight_map(directory: Path) -> dict[str, str]:
    """`weight_map` of model.safetensors.index.json: tensor name → shard file in `directory`.

    Sized for the real thing (DeepSeek-V4-Flash lists ~10⁵ tensors). A shard must be a plain
    file name: an index that points outside its directory (`../x`, `/etc/x`) is refused.
    """
    path = directory / INDEX_NAME
    data = json_object(load_json(path, "checkpoint-index"), str(path), "a shard index",
                       _CKPT_HINT)
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict):
        raise ConfigError(f"{path}: no `weight_map` object", _CKPT_HINT)
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard or "/" in shard or "\\" in shard \
                or shard in (".", ".."):
            raise ConfigError(f"{path}: tensor `{name[:80]}` maps to {str(shard)[:80]!r}, not a "
                              "shard file name in the checkpoint directory", _CKPT_HINT)
    return weight_map
