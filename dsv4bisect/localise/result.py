"""`localise`'s result as JSON (pydantic): what `--json` prints and `localise.json` keeps.

Keys (docs/localise.md documents each):
- `first_divergence`: null, or the first op that left its envelope with its inputs inside —
  `layer` (null for an op outside the layers), `module`, `op`, `what`, `kind` (`activation`,
  `state`, `spec`), `multiple` (its mean divergence ÷ its envelope), `inputs_multiple`,
  `case` and `positions` (the first positions past anything the null showed there), `acts_on`
  (the patches and faults whose code is this op), `parts` (the kernel's part, where told);
- `state`: the prefix-cache restore check (null when not run): its first state op outside the
  envelope, or null, and how many state sites were;
- `speculation`: the first speculative round that emitted what greedy decoding would not;
- `downstream`: per layer, the largest multiple and the sites outside;
- `alignment`: the embedding output's site and whether it is bit-identical in both ends (the
  maintainers' first step: if not, the runs did not compute the same tokens);
- `ends`, `cases`, `null_arms`, `files`, `seconds`, and for SGLang `comparator`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

SCHEMA = "dsv4bisect.localise/1"


class Divergence(BaseModel):
    layer: int | None
    module: str
    op: str
    what: str
    kind: str  # activation | state | spec
    multiple: float | None  # None: JSON has no infinity (a spec round has no envelope)
    inputs_multiple: float | None
    case: str | None = None
    positions: list[int] = Field(default_factory=list)
    site: str = ""
    mean: float | None = None
    envelope: float | None = None
    acts_on: list[str] = Field(default_factory=list)
    parts: dict[str, float] | None = None  # the kernel's parts (repro.kernel_parts)
    detail: dict[str, Any] | None = None  # a speculative round's drafts and tokens


class StateCheck(BaseModel):
    check: str
    first: Divergence | None
    sites_outside: int
    sites: int


class LayerPicture(BaseModel):
    layer: int | None
    max_multiple: float
    sites_outside: int
    sites: int


class EndInfo(BaseModel):
    fingerprint: str
    patches: dict[str, str]
    settings: dict[str, Any] = Field(default_factory=dict)


class CaseInfo(BaseModel):
    case_id: str
    tokens: int
    prompt: int
    why: str


class LocaliseResult(BaseModel):
    schema_: str = Field(SCHEMA, alias="schema")
    engine: str  # embedded | sglang
    profile: str
    bisect_dir: str | None = None
    culprit: str
    revert: str
    good_end_how: str
    ends: dict[str, EndInfo]
    cases: list[CaseInfo]
    null_arms: list[str]
    alignment: dict[str, Any] | None = None  # the embedding: bit-identical in both ends?
    first_divergence: Divergence | None
    activations: Divergence | None  # the activation path's answer alone
    state: StateCheck | None = None
    speculation: Divergence | None = None
    speculation_prompts: int = 0
    downstream: list[LayerPicture] = Field(default_factory=list)
    files: dict[str, str] = Field(default_factory=dict)
    comparator: str | None = None
    notes: list[str] = Field(default_factory=list)
    seconds: dict[str, float] = Field(default_factory=dict)

    model_config = {"populate_by_name": True}

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)
