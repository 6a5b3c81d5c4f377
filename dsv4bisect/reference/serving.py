"""What `dsv4bisect serve` is asked to run (`ServeOptions`) and how the engine behind the HTTP
API is built from it (`build_api`). Transport-free: `reference/server.py` and `http_app.py` own
the sockets.

Options keep SGLang's server-argument names where SGLang has the setting
(`max_running_requests`, `disable_radix_cache`, the `speculative_*` arguments, the
`disaggregation_*` arguments); `chunk_size` is the chunked-prefill token budget
(SGLang's `chunked_prefill_size`, reported under that name in `/server_info`). The scheduler
(`reference/scheduler.py`) honours all three; a prefill or decode server wraps it in its PD role
(`reference/pd/roles.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dsv4bisect.reference.native_api import ServerApi
from dsv4bisect.reference.spec_settings import SpecSettings

HEADER_TIMEOUT_S = 10.0  # from a request's first byte to the end of its headers


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 30000
    checkpoint: str | None = None  # a checkpoint directory; None: the random tiny model
    device: str = "auto"
    chunk_size: int = 2048  # chunked-prefill token budget (SGLang: chunked_prefill_size)
    moe_backend: str = "triton"
    precision: str = "deployment"  # the embedded engine's precision (deployment | exact)
    threads: int | None = None
    max_model_len: int | None = None
    served_model_name: str | None = None
    # the model as the user named it (`serve --checkpoint`: embedded, random or a directory as
    # typed): SGLang's --model-path, the default served model name (`model_name`)
    model_path: str | None = None
    patches: Mapping[str, str] = field(default_factory=dict)  # name -> variant
    header_timeout: float = HEADER_TIMEOUT_S
    # SGLang's --max-running-requests: requests in one decode batch (None: the scheduler's
    # default, 256 as SGLang's for DeepSeek-V4; reference/scheduler.py)
    max_running_requests: int | None = None
    # SGLang's --disable-radix-cache: every request prefills from scratch
    disable_radix_cache: bool = False
    # the bytes the prefix cache may keep (`--prefix-cache-budget-mib`; None: the engine's
    # 1 GiB); no SGLang argument bounds radix-cache bytes (docs/reference-api.md says why)
    prefix_cache_budget_bytes: int | None = None
    # SGLang's --speculative-* arguments, resolved (None: no speculative decoding); the MTP
    # layer beside the checkpoint drafts (reference/spec_decode.py)
    speculative: SpecSettings | None = None
    api: str = "sglang"  # the HTTP API served: sglang | vllm (reference/vllm_api.py) | sglang-router
    # (pd/router.py: SGLang's routes, answered unstreamed: a streamed request is a 400)
    # SGLang's --disaggregation-* arguments (reference/pd/): null (one server), prefill or
    # decode; the prefill server's bootstrap port; the transfer backend (mooncake | nixl)
    disaggregation_mode: str = "null"
    disaggregation_bootstrap_port: int = 8998
    disaggregation_transfer_backend: str = "mooncake"
    # a field fault of the PD transfer (DSV4BISECT_PD_TRANSFER_FAULT; reference/pd/transfer.py)
    transfer_fault: str | None = None


def model_name(opts: ServeOptions) -> str:
    """The id `/v1/models` reports and responses carry: `--served-model-name`, else the model
    path as given, as SGLang (its ServerArgs default `served_model_name` to `model_path`, the
    `--model-path` argument as typed: `sglang/srt/arg_groups/serving_hook.py`, 0.5.23)."""
    return (opts.served_model_name or opts.model_path or opts.checkpoint
            or "reference-tiny-random")


def speculation(opts: ServeOptions) -> SpecSettings | None:
    """The settings speculative decoding runs with: the `--speculative-*` arguments, or the
    SGLang server arguments a patch of the set swaps in for it (`Op.SPECULATION`: the
    nextn-speculation patch's `--speculative-algorithm NEXTN`, SGLang's default). How drafts
    are verified is the model's (`Op.SPEC_VERIFY`, where the patch's fault variants act)."""
    if opts.speculative is not None:
        return opts.speculative
    from dsv4bisect.patchspec.swaps import Op
    from dsv4bisect.reference.config import Numerics
    from dsv4bisect.reference.swappable import PatchSwaps

    numerics = Numerics.from_patches(opts.patches, opts.moe_backend, precision=opts.precision)
    args = PatchSwaps(numerics, None).value(Op.SPECULATION, None)
    return None if args is None else SpecSettings.from_args(args)


def build_api(opts: ServeOptions, *, port: int) -> ServerApi:
    """Load the engine (this imports torch) and wrap it in the endpoint handlers."""
    from dsv4bisect import __version__
    from dsv4bisect.reference.api import ApiConfig
    from dsv4bisect.reference.engine import ReferenceEngine
    from dsv4bisect.reference.generation import Generator
    from dsv4bisect.reference.switch import HotSwitch
    from dsv4bisect.reference.tokenizer import ByteTokenizer

    extra = {} if opts.max_model_len is None else {"max_model_len": opts.max_model_len}
    spec = speculation(opts)
    engine = ReferenceEngine.load(
        opts.checkpoint, patches=dict(opts.patches), moe_backend=opts.moe_backend,
        precision=opts.precision, chunk_size=opts.chunk_size, device=opts.device,
        threads=opts.threads, mtp=spec is not None, **extra,
    )
    name = model_name(opts)
    info = dict(engine.info())
    ratios = info.get("compress_ratios") or (info.get("config") or {}).get("compress_ratios")
    info |= {
        "engine": "dsv4bisect-reference", "version": __version__,
        "served_model_name": name, "max_model_len": engine.max_model_len,
        "compress_ratios": ratios, "moe_backend": opts.moe_backend,
        "chunk_size": opts.chunk_size, "patches": info.get("patches", dict(opts.patches)),
        # SGLang's ServerArgs names for the same settings, for clients that read those
        "model_path": opts.model_path or opts.checkpoint or name,
        "context_length": engine.max_model_len,
        "chunked_prefill_size": opts.chunk_size, "moe_runner_backend": opts.moe_backend,
        "max_running_requests": opts.max_running_requests,
        "disable_radix_cache": opts.disable_radix_cache,
        "host": opts.host, "port": port,
    }
    decode = opts.disaggregation_mode == "decode"  # prefixes arrive whole: no prefix cache
    generator = Generator(engine, ByteTokenizer(engine.config.vocab_size),
                          max_running_requests=opts.max_running_requests,
                          radix_cache=not (opts.disable_radix_cache or decode), spec=spec,
                          prefix_cache_budget=opts.prefix_cache_budget_bytes)
    # the effective value (SGLang reports its derived default the same way)
    info["max_running_requests"] = generator.scheduler.max_running
    info |= {"schedule_policy": "fcfs", "enable_mixed_chunk": False}
    info |= (spec.server_args() if spec is not None else {"speculative_algorithm": None})
    info["api"] = opts.api
    info |= {"disaggregation_mode": opts.disaggregation_mode}
    served: Any = generator
    if opts.disaggregation_mode != "null":
        from dsv4bisect.reference.pd.roles import make_role

        served = make_role(opts.disaggregation_mode, generator,
                           opts.disaggregation_transfer_backend, opts.transfer_fault,
                           opts.host, opts.disaggregation_bootstrap_port)
        info |= {"disaggregation_transfer_backend": opts.disaggregation_transfer_backend,
                 "disaggregation_transfer_fault": opts.transfer_fault,
                 "disable_radix_cache": opts.disable_radix_cache or decode}
        if opts.disaggregation_mode == "prefill":
            info["disaggregation_bootstrap_port"] = served.bootstrap.port
    if opts.api == "vllm":
        from dsv4bisect.reference.vllm_api import VllmApi

        api: ServerApi = VllmApi(served, ApiConfig(name, engine.max_model_len, info))
    else:
        api = ServerApi(served, ApiConfig(name, engine.max_model_len, info))
    api.hot = HotSwitch.from_env(engine, served, info)  # hot mode: the switch protocol
    return api
