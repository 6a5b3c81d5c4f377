"""The processes each engine kind starts, spelled exactly as the engine expects.

SGLang facts (notes/sglang-dsv4.md §6): `python -m sglang.launch_server --model-path … --tp N
--moe-runner-backend … --port …`; PD prefill adds `--disaggregation-mode prefill
--disaggregation-bootstrap-port 8998`, decode `--disaggregation-mode decode`, and the router is
`python -m sglang_router.launch_router --pd-disaggregation --prefill URL PORT --decode URL`.
The embedded engine's PD processes take the same flags: `dsv4bisect serve` with the
`--disaggregation-*` arguments and `dsv4bisect router` with sglang-router's (reference/pd/).
Readiness: `/health_generate` (a real one-token generation) on servers, `/health` on the router.
Each PD role gets its own patch delivery (`roles`: the profile's patches with the role's own
toggles), its env and args.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dsv4bisect.config.engine_config import ProcessSpec
from dsv4bisect.config.schema import Engine, PDRole
from dsv4bisect.env import PATCHES, PD_TRANSFER_FAULT, PLUGIN_NAME, SGLANG_PLUGINS, VLLM_PLUGINS

DEFAULT_REFERENCE_CHUNK = 2048


@dataclass(frozen=True)
class PatchDelivery:
    """What the enabled patches add to the engine processes."""

    wire: str  # DSV4BISECT_PATCHES value (built-in patches only)
    env: dict[str, str]  # env contributed by patches (built-in SGLang env, custom env)
    args: tuple[str, ...]  # server args contributed by patches
    pythonpath: str | None  # source-patch worktree path to put first


def build_processes(engine: Engine, delivery: PatchDelivery,
                    roles: Mapping[str, PatchDelivery] | None = None
                    ) -> tuple[str, tuple[ProcessSpec, ...]]:
    """(entry role, processes) for the engine kind; `roles`: a PD pair's per-role deliveries
    (default: `delivery` for both)."""
    if engine.kind == "command":
        return "server", (_command(engine, delivery),)
    if engine.kind == "vllm":
        return "server", (_vllm_server(engine, delivery),)
    if engine.pd is None:
        if engine.kind == "reference":
            return "server", (_reference(engine, delivery),)
        return "server", (_sglang_server(engine, delivery, "server", engine.gpus, engine.tp, []),)
    pd = engine.pd
    own = dict(roles or {})
    boot = "{port:bootstrap}" if pd.prefill.bootstrap_port == "auto" \
        else str(pd.prefill.bootstrap_port)
    prefill_args = ["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", boot]
    decode_args = ["--disaggregation-mode", "decode"]
    if pd.transfer_backend:
        prefill_args += ["--disaggregation-transfer-backend", pd.transfer_backend]
        decode_args += ["--disaggregation-transfer-backend", pd.transfer_backend]
    servers = []
    for role, spec, args in (("prefill", pd.prefill, prefill_args),
                             ("decode", pd.decode, decode_args)):
        role_delivery = own.get(role, delivery)
        if engine.kind == "reference":
            servers.append(_reference(engine, role_delivery, role, spec, args))
        else:
            servers.append(_pd_server(engine, role_delivery, role, spec, args))
    return "router", (*servers, _router(engine, boot))


def _python(engine: Engine, default: str) -> str:
    return engine.python or default


def _env(*layers: dict[str, str]) -> tuple[tuple[str, str], ...]:
    merged: dict[str, str] = {}
    for layer in layers:
        merged.update(layer)
    return tuple(sorted(merged.items()))


def with_plugin(plugins: str) -> str:
    """An SGLANG_PLUGINS / VLLM_PLUGINS value with ours added (the user's own plugins kept, in
    order)."""
    return ",".join(dict.fromkeys([*(p for p in plugins.split(",") if p), PLUGIN_NAME]))


def _patch_env(engine: Engine, delivery: PatchDelivery, plugin: bool) -> dict[str, str]:
    env = dict(delivery.env)
    env[PATCHES] = delivery.wire
    allowlist = VLLM_PLUGINS if engine.kind == "vllm" else SGLANG_PLUGINS
    if plugin and delivery.wire and (engine.kind != "vllm" or allowlist in engine.env):
        # vLLM loads every installed general plugin when VLLM_PLUGINS is unset: ours is then
        # loaded without being named (and naming it alone would drop the user's others)
        env[allowlist] = with_plugin(engine.env.get(allowlist, ""))
    if delivery.pythonpath:
        base = engine.env.get("PYTHONPATH")
        env["PYTHONPATH"] = delivery.pythonpath + (f":{base}" if base else "")
    return env


def _reference(engine: Engine, delivery: PatchDelivery, role: str = "server",
               spec: PDRole | None = None, role_args: list[str] | None = None) -> ProcessSpec:
    """`dsv4bisect serve`: the one server, or a PD role (`spec`, with the role's flags)."""
    ref = engine.reference
    checkpoint = ref.checkpoint if ref else "embedded"
    argv = ["{python}", "-m", "dsv4bisect", "serve", "--host", engine.host,
            "--port", f"{{port:{role}}}", "--checkpoint", checkpoint,
            "--moe-backend", engine.moe_backend,
            "--precision", engine.precision or "deployment",
            "--chunk-size", str(engine.chunked_prefill_size or DEFAULT_REFERENCE_CHUNK),
            *_serving_flags(engine)]
    if ref is not None:
        argv += ["--device", ref.device]
        if ref.threads:
            argv += ["--threads", str(ref.threads)]
        if ref.max_model_len:
            argv += ["--max-model-len", str(ref.max_model_len)]
    if engine.served_model_name:
        argv += ["--served-model-name", engine.served_model_name]
    if engine.api == "vllm":  # vLLM's API subset (docs/vllm.md); left out: SGLang's, as before
        argv += ["--api", "vllm"]
    role_env: dict[str, str] = {}
    if spec is not None:  # a PD role: its flags and args, then the engine's
        argv += [*(role_args or []), *spec.args]
        role_env = dict(spec.env)
        assert engine.pd is not None
        if engine.pd.transfer_fault:
            role_env[PD_TRANSFER_FAULT] = engine.pd.transfer_fault
    argv += [*engine.args, *delivery.args]
    port = engine.port if spec is None else spec.port
    return ProcessSpec(
        role=role, argv=tuple(argv),
        env=_env(engine.env, role_env, _patch_env(engine, delivery, False)),
        gpus=tuple(engine.gpus or ()), port=_fixed(port),
        ready_path="/health" if engine.api == "vllm" else "/health_generate",
        gets_patches=True, schedulers=1,
    )


def _command(engine: Engine, delivery: PatchDelivery) -> ProcessSpec:
    assert engine.command is not None  # the schema guarantees it for kind: command
    argv = [a.replace("{port}", "{port:server}").replace("{host}", engine.host)
            for a in engine.command.argv]
    argv += [*engine.args, *delivery.args]
    return ProcessSpec(
        role="server", argv=tuple(argv), env=_env(engine.env, _patch_env(engine, delivery, False)),
        gpus=tuple(engine.gpus or ()), port=_fixed(engine.port),
        ready_path=engine.command.ready_path, gets_patches=False, schedulers=0,
    )


def _sglang_common(engine: Engine, role: str, tp: int) -> list[str]:
    argv = [_python(engine, "python3"), "-m", "sglang.launch_server", "--model-path", "{model}",
            "--host", engine.host, "--port", f"{{port:{role}}}", "--tp", str(tp)]
    if engine.dp > 1:
        argv += ["--dp", str(engine.dp), "--enable-dp-attention"]
    argv += ["--moe-runner-backend", engine.moe_backend]
    if engine.quantization:
        argv += ["--quantization", engine.quantization]
    if engine.chunked_prefill_size:
        argv += ["--chunked-prefill-size", str(engine.chunked_prefill_size)]
    argv += _serving_flags(engine)
    if engine.served_model_name:
        argv += ["--served-model-name", engine.served_model_name]
    return argv


def _serving_flags(engine: Engine) -> list[str]:
    """SGLang's batching and prefix-cache flags; `dsv4bisect serve` takes the same names. Left
    out when the profile leaves them to the engine's default, so a profile that does not state
    them starts the engine (and fingerprints) exactly as before they existed."""
    argv: list[str] = []
    if engine.max_running_requests is not None:
        argv += ["--max-running-requests", str(engine.max_running_requests)]
    if engine.disable_radix_cache:
        argv.append("--disable-radix-cache")
    return argv


def _sglang_server(
    engine: Engine, delivery: PatchDelivery, role: str, gpus: list[int] | None, tp: int,
    role_args: list[str], role_env: dict[str, str] | None = None, port: int | str | None = None,
) -> ProcessSpec:
    argv = _sglang_common(engine, role, tp) + role_args + [*engine.args, *delivery.args]
    env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))} if gpus else {}
    return ProcessSpec(
        role=role, argv=tuple(argv),
        env=_env(env, engine.env, role_env or {}, _patch_env(engine, delivery, True)),
        gpus=tuple(gpus or ()), port=_fixed(engine.port if port is None else port),
        # dp > 1 always comes with --enable-dp-attention, under which SGLang starts `tp`
        # schedulers in all (the DP ranks split them), not tp × dp.
        ready_path="/health_generate", gets_patches=True, schedulers=tp,
    )


def _pd_server(
    engine: Engine, delivery: PatchDelivery, role: str, spec: PDRole, extra: list[str]
) -> ProcessSpec:
    tp = spec.tp or len(spec.gpus)
    return _sglang_server(engine, delivery, role, spec.gpus, tp, extra + list(spec.args),
                          spec.env, spec.port)


def _router(engine: Engine, boot: str) -> ProcessSpec:
    """sglang-router's PD mode; the embedded engine's `dsv4bisect router` takes its arguments."""
    pd = engine.pd
    assert pd is not None
    host = engine.host
    head = (["{python}", "-m", "dsv4bisect", "router"] if engine.kind == "reference"
            else [_python(engine, "python3"), "-m", "sglang_router.launch_router"])
    argv = [*head, "--pd-disaggregation", "--prefill", f"http://{host}:{{port:prefill}}", boot,
            "--decode", f"http://{host}:{{port:decode}}",
            "--host", host, "--port", "{port:router}", "--policy", pd.router.policy,
            *pd.router.args]
    return ProcessSpec(
        role="router", argv=tuple(argv), env=_env(pd.router.env), gpus=(),
        port=_fixed(pd.router.port), ready_path="/health", gets_patches=False, schedulers=0,
    )


# vLLM (docs/vllm.md, "Launch"): `vllm serve MODEL` from the engine's Python. VLLM_SERVER_DEV_MODE
# mounts /reset_prefix_cache and /server_info, which the probe uses to empty the prefix cache
# between requests and to read the effective config back; the profile's env may override it.
VLLM_ENV = {"VLLM_SERVER_DEV_MODE": "1"}


def _vllm_server(engine: Engine, delivery: PatchDelivery) -> ProcessSpec:
    """`vllm serve` with SGLang-kind settings in vLLM's terms: tp GPUs, dp as DP attention with
    expert parallelism (--data-parallel-size dp --tensor-parallel-size tp/dp
    --enable-expert-parallel: dp x tp/dp = tp workers), the chunked-prefill budget as
    --max-num-batched-tokens, max_running_requests as --max-num-seqs, the radix cache as
    prefix caching, and prompt token details on (the probe reads cached_tokens)."""
    argv = [_python(engine, "python3"), "-m", "vllm.entrypoints.cli.main", "serve", "{model}",
            "--host", engine.host, "--port", "{port:server}"]
    if engine.dp > 1:
        argv += ["--data-parallel-size", str(engine.dp), "--tensor-parallel-size",
                 str(engine.tp // engine.dp), "--enable-expert-parallel"]
    else:
        argv += ["--tensor-parallel-size", str(engine.tp)]
    argv += ["--moe-backend", engine.moe_backend]
    if engine.quantization:
        argv += ["--quantization", engine.quantization]
    if engine.chunked_prefill_size:
        argv += ["--max-num-batched-tokens", str(engine.chunked_prefill_size)]
    if engine.max_running_requests is not None:
        argv += ["--max-num-seqs", str(engine.max_running_requests)]
    if engine.disable_radix_cache:
        argv.append("--no-enable-prefix-caching")
    argv.append("--enable-prompt-tokens-details")
    if engine.served_model_name:
        argv += ["--served-model-name", engine.served_model_name]
    argv += [*engine.args, *delivery.args]
    gpus = engine.gpus
    env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))} if gpus else {}
    return ProcessSpec(
        role="server", argv=tuple(argv),
        env=_env(VLLM_ENV, env, engine.env, _patch_env(engine, delivery, True)),
        gpus=tuple(gpus or ()), port=_fixed(engine.port), ready_path="/health",
        gets_patches=True, schedulers=engine.tp)


def _fixed(port: int | str | None) -> int | None:
    return port if isinstance(port, int) else None
