"""Speculative decoding's settings, with SGLang's argument names and defaults (torch-free: the
CLI and the profiles resolve them).

`--speculative-algorithm NEXTN` (an alias of EAGLE whose draft is the checkpoint's MTP layer),
`--speculative-num-steps` (draft forwards per round), `--speculative-eagle-topk` (branches per
draft step; 1 is a chain) and `--speculative-num-draft-tokens` (tokens verified per round: the
chain's steps + 1). Given the algorithm alone SGLang 0.5.23 picks (3, 1, 4):
`srt/arg_groups/speculative_hook.py`, `_auto_choose_speculative_params` (DeepSeek-V3/V3.2 by
name, DeepseekV4ForCausalLM by its final `else`), called from `_handle_eagle_family` when
`speculative_num_steps` is None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dsv4bisect.errors import ConfigError

ALGORITHMS = ("NEXTN", "EAGLE")  # NEXTN aliases EAGLE on SGLang; both draft with the MTP layer
DEFAULT_STEPS, DEFAULT_TOPK, DEFAULT_DRAFT_TOKENS = 3, 1, 4  # SGLang's auto choice for DeepSeek


class SpecError(ConfigError):
    """Speculative arguments that do not make a configuration (`error:` + `hint:`)."""


@dataclass(frozen=True)
class SpecSettings:
    algorithm: str = "NEXTN"
    num_steps: int = DEFAULT_STEPS
    eagle_topk: int = DEFAULT_TOPK
    num_draft_tokens: int = DEFAULT_DRAFT_TOKENS

    @classmethod
    def resolve(cls, algorithm: str | None, num_steps: int | None = None,
                eagle_topk: int | None = None,
                num_draft_tokens: int | None = None) -> SpecSettings | None:
        """SGLang's resolution: no algorithm -> no speculation (the other arguments are then
        refused); the algorithm alone -> (3, 1, 4); steps given -> top-k 1 and steps + 1 draft
        tokens (a chain verifies its steps + 1 tokens: SGLang adjusts a different
        --speculative-num-draft-tokens to that when top-k is 1). Raises SpecError."""
        given = {"--speculative-num-steps": num_steps, "--speculative-eagle-topk": eagle_topk,
                 "--speculative-num-draft-tokens": num_draft_tokens}
        if algorithm is None:
            extra = [k for k, v in given.items() if v is not None]
            if extra:
                raise SpecError(f"{', '.join(extra)} given without --speculative-algorithm",
                                "add --speculative-algorithm NEXTN (the MTP layer drafts)")
            return None
        algo = algorithm.upper()
        if algo not in ALGORITHMS:
            raise SpecError(f"unknown --speculative-algorithm `{algorithm}`",
                            "the embedded engine drafts with its MTP layer: NEXTN (or EAGLE)")
        for name, v in given.items():
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise SpecError(f"{name} must be a positive integer, got {v!r}",
                                f"leave {name} out for SGLang's DeepSeek default")
        if eagle_topk is not None and eagle_topk > 1:
            raise SpecError(f"--speculative-eagle-topk {eagle_topk} needs tree verification, "
                            "which the embedded engine does not build",
                            "use --speculative-eagle-topk 1 (a draft chain, SGLang's DeepSeek "
                            "default)")
        if num_steps is None and (eagle_topk is not None or num_draft_tokens is not None):
            raise SpecError("--speculative-eagle-topk / --speculative-num-draft-tokens need "
                            "--speculative-num-steps", "give all three, or the algorithm alone "
                            "for SGLang's DeepSeek default (3, 1, 4)")
        steps = DEFAULT_STEPS if num_steps is None else num_steps
        topk = DEFAULT_TOPK if eagle_topk is None else eagle_topk
        # top-k 1: SGLang adjusts the draft tokens to steps + 1, with a warning
        # (`speculative_hook.py`, "speculative_num_draft_tokens is adjusted to ...")
        drafts = steps + 1
        return cls(algo, steps, topk, drafts)

    @classmethod
    def from_args(cls, argv: tuple[str, ...]) -> SpecSettings | None:
        """Resolve SGLang's `--speculative-*` server arguments given as an argv (a patch's
        `Op.SPECULATION`), as `resolve` does the CLI's. Raises SpecError."""
        values: dict[str, str] = {}
        it = iter(argv)
        for flag in it:
            name = flag.removeprefix("--").replace("-", "_")
            if name not in _ARG_NAMES:
                raise SpecError(f"`{flag}` is not a speculative decoding argument",
                                f"use {', '.join(f'--{n}' for n in _ARG_NAMES)}")
            values[name.removeprefix("speculative_")] = next(it, "")
        ints = {k: int(v) for k, v in values.items() if k != "algorithm"}
        return cls.resolve(values.get("algorithm"), ints.get("num_steps"),
                           ints.get("eagle_topk"), ints.get("num_draft_tokens"))

    def server_args(self) -> dict[str, Any]:
        """As SGLang's `/server_info` names them."""
        return {"speculative_algorithm": self.algorithm,
                "speculative_num_steps": self.num_steps,
                "speculative_eagle_topk": self.eagle_topk,
                "speculative_num_draft_tokens": self.num_draft_tokens}


_ARG_NAMES = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
              "speculative_num_draft_tokens")
