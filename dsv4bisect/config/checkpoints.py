"""Where the embedded engine's weights come from: `embedded`, `random`, or a directory."""

from __future__ import annotations

from pathlib import Path

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
