"""The profile schema (DESIGN §4): strict pydantic models, unknown keys are errors.

A profile is data. These models only check shape and types; what the values mean (which patches
exist, which processes to start) is decided by `resolve.py`.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from dsv4bisect.errors import ConfigError
from dsv4bisect.patching.transfer_faults import check_fault
from dsv4bisect.policy import DriftRule, Executor, WarnAs

SCHEMA_VERSION = 1

Port = Union[Annotated[int, Field(ge=1, le=65535)], Literal["auto"]]

# Ranges (issue 15): every number is bounded, so a typo such as `parallel: 1e28` is an error at
# validation, not a hang or a failed launch. The bounds are generous for a real deployment.
MAX_GPUS = 1024  # GPU indices and ranks; an 8-GPU node uses 0..7
MAX_TOKENS = 1 << 24  # context lengths and chunk sizes (V4 serves 1M tokens)
MAX_SECONDS = 7 * 24 * 3600.0  # timeouts: a week
MAX_REQUESTS = 1 << 16  # max_running_requests, probe concurrency levels
GpuIndex = Annotated[int, Field(ge=0, lt=MAX_GPUS)]
Ranks = Annotated[int, Field(ge=1, le=MAX_GPUS)]
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS)]


def _no_nul(value: Any) -> Any:
    if isinstance(value, str) and "\0" in value:
        raise ValueError("NUL characters are not allowed (no process can receive them)")
    return value


Arg = Annotated[str, BeforeValidator(_no_nul)]  # an argv element: the OS refuses NUL
Args = list[Arg]


def _env_values(value: Any) -> Any:
    """Env values are strings; numbers are written as YAML reads them (`X: 1` → "1")."""
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        # The OS builds `NAME=value` strings: `=` or NUL in a name, or NUL in a value, would
        # fail only at launch (or silently set another variable).
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise ValueError(f"env name {str(key)[:40]!r}: must be non-empty, without `=` or NUL")
        if isinstance(item, str) and "\0" in item:
            raise ValueError(f"env `{key}`: NUL characters are not allowed in a value")
        if isinstance(item, bool):
            raise ValueError(f"env `{key}`: write booleans as strings (\"1\", \"true\")")
        out[key] = str(item) if isinstance(item, (int, float)) else item
    return out


EnvMap = Annotated[dict[str, str], BeforeValidator(_env_values)]


def _words(kind: type[Enum]) -> Any:
    """The values of one of the trial policy's enums as a `Literal` (dsv4bisect/policy.py
    defines them once; a Literal keeps the profile's field a plain word in the schema)."""
    return Literal[tuple(e.value for e in kind)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class PatchToggle(Strict):
    enabled: bool = True
    variant: str | None = None


def _bool_toggles(value: Any) -> Any:
    """`P: true` is `P: {enabled: true}` (profile patches and a PD role's own)."""
    if isinstance(value, dict):
        return {k: {"enabled": v} if isinstance(v, bool) else v for k, v in value.items()}
    return value


PatchToggles = Annotated[dict[str, PatchToggle], BeforeValidator(_bool_toggles)]


class PDRole(Strict):
    """One server of a prefill/decode pair. `patches`: this role's own, on top of the profile's
    (`P: true` turns P on here only, `P: false` off here only): the two servers may run
    different code, and a bisect can name a patch of one role (docs/profiles.md, "PD")."""

    gpus: list[GpuIndex] | None = Field(None, min_length=1, max_length=MAX_GPUS)  # sglang only
    tp: Ranks | None = None  # default: one rank per GPU
    port: Port = "auto"
    args: Args = []
    env: EnvMap = {}
    patches: PatchToggles = {}


class PrefillRole(PDRole):
    # the router's second argument after --prefill URL; `auto`: a free port at launch (the
    # embedded engine on a machine that runs several trials at once)
    bootstrap_port: Port = 8998


class Router(Strict):
    port: Port = "auto"
    policy: str = "round_robin"
    args: Args = []
    env: EnvMap = {}


class PD(Strict):
    """Prefill/decode disaggregation on one node: two SGLang servers and the router (kind:
    sglang only; vLLM's disaggregation is not modelled: docs/vllm.md)."""

    prefill: PrefillRole
    decode: PDRole
    router: Router = Router()
    transfer_backend: str | None = None  # mooncake (SGLang's default) | nixl | mori
    # kind: reference only: a field fault of the transfer path (patching/transfer_faults.py)
    transfer_fault: str | None = None

    @field_validator("transfer_fault")
    @classmethod
    def _known_fault(cls, value: str | None) -> str | None:
        try:
            return check_fault(value)
        except ConfigError as exc:
            raise ValueError(f"{exc.message} ({exc.hint})") from None


class ReferenceSettings(Strict):
    """The embedded engine (`dsv4bisect serve`)."""

    checkpoint: str = "embedded"  # "embedded" (shipped), "random" (seed 0 tiny), or a directory
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: Annotated[int, Field(ge=1, le=4096)] | None = None
    max_model_len: Annotated[int, Field(ge=64, le=MAX_TOKENS)] | None = None


class CommandSettings(Strict):
    """Any server: argv may use {port} and {host}; readiness by GET on ready_path."""

    argv: Args = Field(min_length=1)
    ready_path: str = "/health"


REFERENCE_BACKENDS = ("mooncake", "nixl")  # the embedded engine's transfer backends


def _check_pd(kind: str, pd: PD) -> None:
    if kind == "sglang":
        for role, spec in (("prefill", pd.prefill), ("decode", pd.decode)):
            if spec.gpus is None:
                raise ValueError(f"pd.{role}.gpus: an SGLang server of the pair needs its GPUs")
        if pd.transfer_fault is not None:
            raise ValueError("pd.transfer_fault is a fault of the embedded engine's transfer "
                             "(kind: reference); a real deployment has its release's bugs")
        return
    if pd.transfer_backend not in (None, *REFERENCE_BACKENDS):
        raise ValueError(f"pd.transfer_backend: the embedded engine transfers with "
                         f"{' or '.join(REFERENCE_BACKENDS)}, not {pd.transfer_backend}")


class Engine(Strict):
    kind: Literal["reference", "sglang", "vllm", "command"]
    model: str | None = None  # SGLang --model-path
    served_model_name: str | None = None
    api_key_env: str | None = None  # name of the env var holding the API key, never the key
    sglang_version: str | None = None  # the deployment's SGLang, for patch conditions
    gpu_arch: Literal["sm120", "sm100", "sm90"] | None = None  # the GPUs (default: sm120)
    allow_unverified_sglang: bool = False  # run on an SGLang release no one verified
    vllm_version: str | None = None  # kind: vllm: the deployment's vLLM (docs/vllm.md)
    allow_unverified_vllm: bool = False  # run on a vLLM release no one verified
    # kind: reference only: the HTTP API the embedded engine serves (`serve --api`): SGLang's
    # (default) or vLLM's subset, so a probe or bisect runs over vLLM's API end to end here
    api: Literal["sglang", "vllm"] | None = None
    expert_quant: Literal["nvfp4", "mxfp4", "fp8", "bf16"] | None = None
    python: str | None = None  # interpreter for engine processes (default: this one / python3)
    host: str = "127.0.0.1"
    port: Port = "auto"
    gpus: list[GpuIndex] | None = Field(default=None, max_length=MAX_GPUS)
    tp: Ranks = 1
    dp: Ranks = 1
    moe_backend: str = "triton"
    # kind: reference only: the embedded engine's numerics (deployment: the seed deployment's
    # NVFP4 / FP8 formats; exact: fp32). None: deployment.
    precision: Literal["deployment", "exact"] | None = None
    quantization: str | None = None
    # Serving settings, SGLang's server arguments under their own names and meanings, for both
    # engine kinds (docs/profiles.md "Serving settings"): the chunked-prefill token budget of
    # one prefill batch, the most requests one batch runs, and the prefix (radix) cache off.
    # None / false: the engine's own default (the flag is not passed).
    chunked_prefill_size: Annotated[int, Field(ge=1, le=MAX_TOKENS)] | None = None
    max_running_requests: Annotated[int, Field(ge=1, le=MAX_REQUESTS)] | None = None
    disable_radix_cache: bool = False
    env: EnvMap = {}
    args: Args = []
    startup_timeout_s: Seconds = 1800.0
    pd: PD | None = None
    reference: ReferenceSettings | None = None
    command: CommandSettings | None = None

    @model_validator(mode="after")
    def _kind_sections(self) -> Engine:
        if self.kind == "vllm" and self.pd is not None:
            raise ValueError("`pd` is SGLang's prefill/decode pair; the vllm kind does not "
                             "start vLLM's disaggregation (--kv-transfer-config and a proxy): "
                             "run that deployment as kind: command")
        if self.kind == "command" and self.pd is not None:
            raise ValueError("`pd` is only valid with kind: sglang or reference")
        if self.pd is not None:
            _check_pd(self.kind, self.pd)
        if self.kind != "reference" and self.reference is not None:
            raise ValueError("`reference` is only valid with kind: reference")
        if self.kind != "reference" and self.precision is not None:
            raise ValueError("`precision` is only valid with kind: reference (a real "
                             "deployment's precision is its checkpoint and server flags)")
        if self.kind == "command" and self.command is None:
            raise ValueError("kind: command needs a `command` section with argv")
        if self.kind != "command" and self.command is not None:
            raise ValueError("`command` is only valid with kind: command")
        if self.kind == "sglang" and not self.model:
            raise ValueError("kind: sglang needs `model` (the --model-path)")
        if self.kind == "vllm" and not self.model:
            raise ValueError("kind: vllm needs `model` (what `vllm serve` serves)")
        if self.kind != "reference" and self.api is not None:
            raise ValueError("`api` is only valid with kind: reference (a real engine serves "
                             "its own API: kind sglang or vllm says which)")
        if self.kind != "vllm" and (self.vllm_version or self.allow_unverified_vllm):
            raise ValueError("`vllm_version` / `allow_unverified_vllm` are only valid with "
                             "kind: vllm")
        if self.kind == "vllm" and self.dp > 1 and self.tp % self.dp:
            raise ValueError(f"kind: vllm takes dp as SGLang's DP attention inside the tp GPUs: "
                             f"tp ({self.tp}) must be a multiple of dp ({self.dp})")
        return self


class SourcePatch(Strict):
    """A source change to the engine: a diff file or a commit range of a git checkout."""

    repo: str  # git checkout of the engine (e.g. an SGLang clone)
    diff: str | None = None  # path of a unified diff, relative to the profile file
    commits: str | None = None  # "A..B" in `repo`
    base: str = "HEAD"  # what the worktree starts from
    pythonpath: str = "python"  # subdirectory put first on PYTHONPATH (SGLang keeps its package there)

    @model_validator(mode="after")
    def _one_source(self) -> SourcePatch:
        if (self.diff is None) == (self.commits is None):
            raise ValueError("a source patch needs exactly one of `diff` or `commits`")
        if self.commits is not None and ".." not in self.commits:
            raise ValueError("`commits` must be a range A..B")
        return self


class CustomPatch(Strict):
    """A user's own patch; it resolves, diffs and bisects like the built-ins."""

    summary: str
    tier: Annotated[int, Field(ge=1, le=3)] = 2
    env: EnvMap = {}
    args: Args = []
    source: SourcePatch | None = None

    @model_validator(mode="after")
    def _delivers_something(self) -> CustomPatch:
        if not (self.env or self.args or self.source):
            raise ValueError("a custom patch needs env, args or source")
        return self


class ProbeSettings(Strict):
    tier: Literal["ci", "smoke", "standard", "deep"] = "smoke"
    families: list[str] | None = None  # default: the tier's
    lengths: list[Annotated[int, Field(ge=16, le=MAX_TOKENS)]] | None = Field(None, max_length=64)
    depths: list[Annotated[float, Field(ge=0, le=1)]] | None = Field(None, max_length=64)
    seed: Annotated[int, Field(ge=0, lt=1 << 63)] = 0
    warm: bool = False
    thinking: bool = False
    request_timeout_s: Seconds = 300.0
    # Requests in flight at once, per level: every case of the tier runs at each level
    # (docs/probe.md "Conditions"). None: the tier's own, [1].
    concurrency: list[Annotated[int, Field(ge=1, le=MAX_REQUESTS)]] | None = Field(
        None, min_length=1, max_length=8)
    # The polluting phase: this many requests of other conversations on the same server before
    # the measured ones (docs/probe.md "Requests that come late"). None: the tier's (standard
    # and deep 256, ci and smoke 0).
    warmup_requests: Annotated[int, Field(ge=0, le=MAX_REQUESTS)] | None = None

    @field_validator("concurrency")
    @classmethod
    def _increasing(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and any(a >= b for a, b in zip(value, value[1:])):
            raise ValueError("list the concurrency levels in increasing order, without repeats")
        return value


class BisectSettings(Strict):
    candidates: list[str] | None = None
    good: list[str] | None = None  # patches on at the good end (default: the required ones)
    confidence: Annotated[float, Field(gt=0.5, lt=1)] = 0.95
    max_trials: Annotated[int, Field(ge=1, le=100_000)] | None = None
    parallel: Annotated[int, Field(ge=1, le=64)] = 1  # trials at once: engines on one node
    # how a drift WARN counts (bisect.md): auto = like the bad end when the bad end itself only
    # drifts, like the good end when the bad end loses facts
    warn_as: _words(WarnAs) = WarnAs.AUTO.value  # type: ignore[valid-type]
    # how a sequential trial's drift is judged: against the ends (relative; the default where a
    # trial is a hot sequential probe) or by the run's gate (absolute); bisect.md
    drift: _words(DriftRule) | None = None  # type: ignore[valid-type]
    # probe the ends at the full tier at once, not in two looks (bisect.md, "Ends that stop
    # when their question is answered"; the looks apply to hot sequential trials only)
    full_ends: bool = False
    priors: dict[str, Annotated[float, Field(gt=0, le=1e6)]] | None = None
    # Where trials run (docs/cluster.md): this machine, or the nodes of a Ray cluster.
    executor: _words(Executor) = Executor.LOCAL.value  # type: ignore[valid-type]
    ray_address: str | None = None  # HEAD:6379; default: RAY_ADDRESS or the local `ray start`
    # A custom Ray resource each node offers one unit of: one trial slot holds a whole node.
    node_resource: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$")] | None = None
    # How a sharding executor runs the ends (bisect/rounds.py, docs/cluster.md): auto = the
    # schedule the node plan prices lower for these nodes and costs
    ends: Literal["auto", "alone", "together", "beside"] = "auto"


class Profile(Strict):
    schema_version: Literal[1]
    # At most 64 characters (as `profile new` allows): the name goes into run directory names,
    # and a file name has 255 bytes at most.
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=64)
    description: str = ""
    extends: str | None = None
    engine: Engine
    patches: dict[str, PatchToggle] = {}
    custom_patches: dict[str, CustomPatch] = {}
    probe: ProbeSettings = ProbeSettings()
    bisect: BisectSettings = BisectSettings()

    @field_validator("patches", mode="before")
    @classmethod
    def _bool_toggles(cls, value: Any) -> Any:
        return _bool_toggles(value)
