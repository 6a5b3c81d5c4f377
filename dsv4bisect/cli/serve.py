"""`dsv4bisect serve`: the embedded reference engine behind SGLang's (or vLLM's) HTTP API subset."""

from __future__ import annotations

import logging
import os
from enum import Enum
from typing import Annotated, Any

import typer


class Precision(str, Enum):
    deployment = "deployment"
    exact = "exact"


class ApiKind(str, Enum):
    sglang = "sglang"
    vllm = "vllm"


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class DisaggregationMode(str, Enum):
    null = "null"
    prefill = "prefill"
    decode = "decode"


class TransferBackend(str, Enum):
    mooncake = "mooncake"
    nixl = "nixl"


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def serve(
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free port).")] = 30000,
    checkpoint: Annotated[str, typer.Option(
        metavar="embedded|random|DIR", help="`embedded` (the shipped trained checkpoint), "
        "`random` (seed-0 random tiny model) or a checkpoint directory (config.json + "
        "safetensors).")] = "embedded",
    device: Annotated[Device, typer.Option(help="Where the model runs.")] = Device.auto,
    chunk_size: Annotated[int, typer.Option(min=1, help="Chunked-prefill size in tokens.")] = 2048,
    moe_backend: Annotated[str, typer.Option(
        metavar="NAME", help="The MoE runner backend to emulate (triton, flashinfer_trtllm, ...)."
    )] = "triton",
    precision: Annotated[Precision, typer.Option(
        help="`deployment`: NVFP4 routed experts, FP8 attention / shared experts, FP8 KV cache "
        "and indexer keys, as the seed deployment; `exact`: the fp32 path.")
    ] = Precision.deployment,
    threads: Annotated[int | None, typer.Option(min=1, help="CPU threads for torch.")] = None,
    max_model_len: Annotated[int | None, typer.Option(
        min=2, help="Context length (default: the engine's).")] = None,
    served_model_name: Annotated[str | None, typer.Option(
        metavar="NAME", help="Model id in /v1/models and responses (default: --checkpoint as "
        "given, as SGLang's --model-path).")] = None,
    header_timeout: Annotated[float, typer.Option(
        min=0.1, max=3600, metavar="SECONDS",
        help="Drop a connection whose request headers take longer than this.")] = 10.0,
    max_running_requests: Annotated[int | None, typer.Option(
        min=1, help="Requests decoded in one batch (SGLang's name; default: the engine's).")
    ] = None,
    disable_radix_cache: Annotated[bool, typer.Option(
        "--disable-radix-cache", help="Prefill every request from scratch (SGLang's name).")
    ] = False,
    prefix_cache_budget_mib: Annotated[int, typer.Option(
        min=1, metavar="MIB", help="Memory the prefix cache may keep, in MiB (every snapshot "
        "tensor counted; least recently used dropped beyond it).")] = 1024,
    speculative_algorithm: Annotated[str | None, typer.Option(
        metavar="NEXTN", help="Speculative decoding with the checkpoint's MTP layer as the "
        "draft (SGLang's name; NEXTN or EAGLE). Alone: 3 steps, top-k 1, 4 draft tokens.")
    ] = None,
    speculative_num_steps: Annotated[int | None, typer.Option(
        help="MTP draft steps per round (SGLang's name).")] = None,
    speculative_eagle_topk: Annotated[int | None, typer.Option(
        help="Draft branches per step; only 1 (a chain) is built (SGLang's name).")] = None,
    speculative_num_draft_tokens: Annotated[int | None, typer.Option(
        help="Tokens verified per round: steps + 1 for a chain (SGLang's name).")] = None,
    api: Annotated[ApiKind, typer.Option(
        help="The HTTP API served: SGLang's subset, or vLLM's (docs/vllm.md).")
    ] = ApiKind.sglang,
    disaggregation_mode: Annotated[DisaggregationMode, typer.Option(
        help="PD disaggregation (SGLang's name): `prefill` computes prompts and sends their "
        "state, `decode` receives it and decodes; requests come through `dsv4bisect router`.")
    ] = DisaggregationMode.null,
    disaggregation_bootstrap_port: Annotated[int, typer.Option(
        min=0, max=65535, help="A prefill server's bootstrap port, where decode servers fetch "
        "state (SGLang's name and default; 0: any free port).")] = 8998,
    disaggregation_transfer_backend: Annotated[TransferBackend, typer.Option(
        help="How the state moves (SGLang's names; both over TCP here).")
    ] = TransferBackend.mooncake,
) -> None:
    """Serve the embedded DeepSeek-V4 reference engine on SGLang's HTTP API subset.

    The patch set comes from DSV4BISECT_PATCHES, exactly as the SGLang plugin reads it. Stops
    cleanly on SIGTERM or Ctrl-C.
    """
    from dsv4bisect.reference.stop_signal import StopSignal

    # first, before the imports below (uvicorn, starlette: a second or more on a loaded
    # machine): a SIGTERM sent right after the launch is then kept, not lost or fatal
    signals = StopSignal.install()
    try:
        from dsv4bisect.config.checkpoints import checkpoint_dir
        from dsv4bisect.patching.registry import builtin_patches
        from dsv4bisect.patching.wire import ENV_VAR, parse_patch_set
        from dsv4bisect.reference.server import serve as run_server
        from dsv4bisect.reference.serving import ServeOptions
        from dsv4bisect.reference.spec_settings import SpecSettings
        from dsv4bisect.patching.transfer_faults import fault_from_env

        patches = parse_patch_set(os.environ.get(ENV_VAR, ""), builtin_patches())
        directory = checkpoint_dir(checkpoint)
        speculative = SpecSettings.resolve(speculative_algorithm, speculative_num_steps,
                                           speculative_eagle_topk, speculative_num_draft_tokens)
        log_requests_to_stderr()
        opts = ServeOptions(
            host=host, port=port, checkpoint=None if directory is None else str(directory),
            device=device.value, chunk_size=chunk_size, moe_backend=moe_backend,
            precision=precision.value, threads=threads,
            max_model_len=max_model_len, served_model_name=served_model_name, patches=patches,
            model_path=checkpoint,
            header_timeout=header_timeout, max_running_requests=max_running_requests,
            disable_radix_cache=disable_radix_cache, speculative=speculative, api=api.value,
            prefix_cache_budget_bytes=prefix_cache_budget_mib << 20,
            disaggregation_mode=disaggregation_mode.value,
            disaggregation_bootstrap_port=disaggregation_bootstrap_port,
            disaggregation_transfer_backend=disaggregation_transfer_backend.value,
            transfer_fault=fault_from_env() if disaggregation_mode.value != "null" else None,
        )
        run_server(opts, _print_ready, signals)
    finally:
        signals.close()
    if signals.received is not None:
        _exit_stopped()


def _exit_stopped() -> None:
    """Stopped by a signal, every request thread joined: end the process here. Interpreter
    finalisation with torch loaded is seconds of CPU (minutes on a starved machine) that no
    deadline covers and nothing needs: the logs are flushed first."""
    from dsv4bisect.reference.stop_signal import exit_now

    logging.shutdown()
    exit_now()


def _print_ready(url: str, info: dict[str, Any]) -> None:
    from dsv4bisect.ui.console import console

    patches = info.get("patches") or {}
    listing = ", ".join(f"{k}:{v}" for k, v in patches.items()) or "none"
    mode = info.get("disaggregation_mode") or "null"
    pd = "" if mode == "null" else (
        f", {mode} server, transfer {info.get('disaggregation_transfer_backend')}"
        + (f", bootstrap port {info['disaggregation_bootstrap_port']}"
           if mode == "prefill" else "")
        + (f", transfer fault {info['disaggregation_transfer_fault']}"
           if info.get("disaggregation_transfer_fault") else ""))
    console().print(
        f"ready: dsv4bisect reference engine on {url} (model {info.get('served_model_name')}, "
        f"device {info.get('device')}, max_model_len {info.get('max_model_len')}, "
        f"patches {listing}{pd})",
        markup=False, highlight=False,
    )
    console().file.flush()


def log_requests_to_stderr() -> None:
    """One plain line per request on stderr, unless the app already configured logging."""
    if logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger = logging.getLogger("dsv4bisect.reference")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
