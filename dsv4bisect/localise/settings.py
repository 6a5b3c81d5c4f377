"""An embedded-engine configuration as `localise` loads it in-process: read from the resolved
`dsv4bisect serve` command line of an `EngineConfig`, so it is exactly what `run` would launch
(checkpoint, precision, MoE backend, chunk size, speculation, radix cache, patch set).
Torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dsv4bisect.config.checkpoints import checkpoint_dir
from dsv4bisect.config.diff import argv_items
from dsv4bisect.config.engine_config import EngineConfig
from dsv4bisect.errors import ConfigError

SPEC_PATCH = "nextn-speculation"  # reference/spec_settings.py's (not imported: torch-free)


@dataclass(frozen=True)
class EmbeddedSettings:
    checkpoint: str  # as the profile names it: embedded | random | DIR
    patches: dict[str, str] = field(default_factory=dict)
    moe_backend: str = "triton"
    precision: str = "deployment"
    chunk_size: int = 2048
    device: str = "auto"
    threads: int | None = None
    radix_cache: bool = True
    speculative: dict[str, int | str] | None = None  # SGLang's --speculative-* arguments

    @property
    def directory(self) -> str | None:
        d = checkpoint_dir(self.checkpoint)
        return None if d is None else str(d)

    @property
    def load_key(self) -> tuple[Any, ...]:
        """What a loaded engine depends on beyond its patch set (a switch covers those)."""
        return (self.checkpoint, self.precision, self.moe_backend, self.device,
                self.speculative is not None)

    @classmethod
    def from_config(cls, cfg: EngineConfig) -> EmbeddedSettings:
        if cfg.kind != "reference":
            raise ConfigError(f"`{cfg.profile}` runs a `{cfg.kind}` engine, not the embedded one",
                              "this path localises the embedded engine; SGLang profiles go "
                              "through the dumper path")
        items = argv_items(list(cfg.process(cfg.entry_role).argv))
        patches = cfg.patch_set
        variant = patches.get(SPEC_PATCH)
        spec: dict[str, int | str] | None = None
        if "--speculative-algorithm" in items or variant is not None:
            spec = {"algorithm": items.get("--speculative-algorithm") or "NEXTN"}
            for flag, key in (("--speculative-num-steps", "num_steps"),
                              ("--speculative-eagle-topk", "eagle_topk"),
                              ("--speculative-num-draft-tokens", "num_draft_tokens")):
                if items.get(flag):
                    spec[key] = int(items[flag])
        threads = items.get("--threads")
        return cls(
            checkpoint=items.get("--checkpoint") or "embedded", patches=dict(patches),
            moe_backend=items.get("--moe-backend") or "triton",
            precision=items.get("--precision") or "deployment",
            chunk_size=int(items.get("--chunk-size") or 2048),
            device=items.get("--device") or "auto", threads=int(threads) if threads else None,
            radix_cache="--disable-radix-cache" not in items, speculative=spec)
