"""The MTP (NextN) layer kept in a file of its own beside a checkpoint, and its batched forward.

A checkpoint directory may hold, beside its main shards, `mtp.safetensors` (the `mtp.0.*`
tensors, DeepSeek's names) and `mtp.json` (the config entries the MTP layer adds:
`num_nextn_predict_layers` and its layers' compress ratios). Neither is listed in config.json
or the shard index, so the main model's bytes, its config and every fingerprint taken of them
(`config.fingerprint.model_identity`) are the same with or without the MTP layer, and a loader
that is not asked for it never reads it (`checkpoint.load_model(path, mtp=True)` does).

Storage is the deployment's (`nvidia/DeepSeek-V4-Flash-NVFP4` keeps its MTP layer in FP8): every
matrix of the MTP layer that is a GEMM weight on the deployment — e_proj / h_proj, the
attention's projections, the shared and the routed experts — in DeepSeek's block FP8 (E4M3, a
UE8M0 `.scale` per 128 × 128), the norms, router, attention sink and mHC parameters in bf16
(`deployment_tensors`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from dsv4bisect.errors import ConfigError
from dsv4bisect.reference.cache import MTPState
from dsv4bisect.reference.config import ModelArgs
from dsv4bisect.reference.model import Block, TrainHooks, Transformer, hc_head, is_fp8_module
from dsv4bisect.reference.quant_formats import encode

MTP_CONFIG_NAME = "mtp.json"
MTP_WEIGHTS_NAME = "mtp.safetensors"
_HINT = ("an MTP layer beside a checkpoint is `mtp.json` + `mtp.safetensors` in its directory "
         "(docs/training.md, 'The MTP layer'); load without `mtp` to serve the main model alone")


def has_mtp_file(directory: str | Path) -> bool:
    d = Path(directory)
    return (d / MTP_CONFIG_NAME).is_file() and (d / MTP_WEIGHTS_NAME).is_file()


def read_mtp_config(directory: str | Path) -> dict[str, Any]:
    """`mtp.json` of a checkpoint directory (ConfigError when absent or malformed)."""
    path = Path(directory) / MTP_CONFIG_NAME
    if not has_mtp_file(directory):
        raise ConfigError(f"checkpoint {Path(directory)} has no MTP layer file "
                          f"({MTP_CONFIG_NAME} + {MTP_WEIGHTS_NAME})", _HINT)
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: not readable JSON ({e})", _HINT) from None
    n = cfg.get("num_nextn_predict_layers") if isinstance(cfg, dict) else None
    ratios = cfg.get("compress_ratios") if isinstance(cfg, dict) else None
    if not (isinstance(n, int) and n >= 1 and isinstance(ratios, list) and len(ratios) == n
            and all(isinstance(r, int) and r >= 0 for r in ratios)):
        raise ConfigError(f"{path}: needs `num_nextn_predict_layers` >= 1 and one "
                          "`compress_ratios` entry per MTP layer", _HINT)
    return cfg


def with_mtp(args: ModelArgs, mtp_config: dict[str, Any]) -> ModelArgs:
    """The main model's args with the MTP layers of `mtp.json` (ratios after the main layers')."""
    L = args.num_hidden_layers
    ratios = tuple(args.compress_ratios[:L]) + tuple(mtp_config["compress_ratios"])
    return args.with_(num_nextn_predict_layers=mtp_config["num_nextn_predict_layers"],
                      compress_ratios=ratios)


def mtp_config_of(args: ModelArgs) -> dict[str, Any]:
    """The `mtp.json` entries of a model built with MTP layers."""
    L, n = args.num_hidden_layers, args.num_nextn_predict_layers
    return {"num_nextn_predict_layers": n,
            "compress_ratios": [args.ratio(L + i) for i in range(n)]}


def deployment_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`mtp.*` tensors (fp32 or bf16) as the deployment checkpoint stores them: the GEMM weights
    (e_proj, h_proj, attention projections, shared and routed experts) in block FP8, the rest
    bf16 (integer tensors as they are)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        module = name.removesuffix(".weight")
        gemm = name.endswith(".weight") and (is_fp8_module(module) or ".ffn.experts." in name)
        if gemm:
            out.update(encode(name, t.float(), "fp8-block"))
        else:
            out[name] = t.to(torch.bfloat16) if t.is_floating_point() else t
    return out


def save_mtp(directory: str | Path, args: ModelArgs, state: dict[str, torch.Tensor],
             provenance: dict[str, Any] | None = None) -> None:
    """Write `mtp.safetensors` (deployment format) and `mtp.json` into `directory`."""
    from safetensors.torch import save_file

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tensors = deployment_tensors({k: v for k, v in state.items() if k.startswith("mtp.")})
    save_file({k: v.detach().cpu().contiguous() for k, v in sorted(tensors.items())},
              str(d / MTP_WEIGHTS_NAME), metadata={"format": "pt"})
    cfg = {**mtp_config_of(args), **({"trained": provenance} if provenance else {})}
    (d / MTP_CONFIG_NAME).write_text(json.dumps(cfg, indent=2) + "\n")


# ---- forward ------------------------------------------------------------------------------------


def main_hidden_batch(model: Transformer, tokens: torch.Tensor,
                      train: TrainHooks | None = None) -> torch.Tensor:
    """The main model's final streams of B equal-length sequences: tokens [B, T] ->
    [B·T, n, dim] (as `forward_batch`, before hc_head)."""
    return model.hidden_batch(tokens, train)


def mtp_logits_batch(model: Transformer, h: torch.Tensor, next_tokens: torch.Tensor,
                     train: TrainHooks | None = None, depth: int = 0) -> torch.Tensor:
    """MTP module `depth` over B sequences at once, as `Transformer.mtp_logits` over one.
    h: main final streams [B·T, n, dim] of tokens 0..T-1 of each row; next_tokens [B, T] =
    tokens 1..T. Returns logits [B, T, vocab]: row b, position t predicts token t+2."""
    return mtp_streams_batch(model, h, next_tokens, train, depth)[1]


def mtp_streams_batch(model: Transformer, h: torch.Tensor, next_tokens: torch.Tensor,
                      train: TrainHooks | None = None, depth: int = 0
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """`mtp_logits_batch` that also returns the MTP layer's output streams [B·T, n, dim]
    (before hc_head: what a chained draft step feeds back in as its `h`)."""
    B, T = next_tokens.shape
    blk = model.mtp[depth]
    flat = next_tokens.reshape(-1)
    step = model._step(flat, 0, B, train)
    e = blk.e_proj(blk.enorm(model.embed(flat)))  # [B·T, dim]
    x = blk.h_proj(blk.hnorm(h)) + e[:, None, :]  # [B·T, n, dim]
    x = Block.forward(blk, x, step, [blk.attn.new_cache(h.device) for _ in range(B)])
    y = hc_head(x, blk.hc_head_fn, blk.hc_head_scale, blk.hc_head_base, model.a)
    return x, model.head(blk.norm(y)).view(B, T, -1)


def mtp_ragged(model: Transformer, chunks: list[tuple[torch.Tensor, torch.Tensor, MTPState]],
               logits: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """MTP module 0 over several sequences' next rows at once, each against its own state
    (serving: speculative decoding). chunks of (h [T, n, dim]: main (or, drafting, MTP) final
    streams at positions t, tokens [T]: the tokens at t + 1, state: its `rows` is the first t)
    -> (output streams [ΣT, n, dim], logits [ΣT, vocab] predicting the tokens at t + 2, or
    None without `logits`); appends to the states' layer caches and advances `rows`."""
    blk = model.mtp[0]
    step = model._ragged_step([model._step(t, s.rows) for _, t, s in chunks])
    e = blk.e_proj(blk.enorm(model.embed(step.tokens)))  # [N, dim]
    h = torch.cat([h for h, _, _ in chunks])
    x = blk.h_proj(blk.hnorm(h)) + e[:, None, :]  # [N, n, dim]
    x = Block.forward(blk, x, step, [s.layer for _, _, s in chunks])
    for _, tokens, state in chunks:
        state.rows += tokens.shape[0]
    if not logits:
        return x, None
    y = hc_head(x, blk.hc_head_fn, blk.hc_head_scale, blk.hc_head_base, model.a)
    return x, model.head(blk.norm(y))


def feed_mtp(model: Transformer, chunks: list[tuple[torch.Tensor, torch.Tensor, MTPState]]
             ) -> None:
    """Keep MTP states in step with their main caches after the main model ran `tokens` [T]
    with final streams `h` [T, n, dim] per chunk: the rows whose next token is now known run
    (the held streams of the previous last position with the first token, then h[:-1] with
    tokens[1:]), and h[-1] is held for the next token (`cache.MTPState`)."""
    work = []
    for h, tokens, state in chunks:
        if state.h is None:  # the sequence's first tokens: position 0 has no streams before it
            rows_h, rows_t = h[:-1], tokens[1:]
        else:
            rows_h, rows_t = torch.cat((state.h[None], h[:-1])), tokens
        state.h = h[-1].clone()  # a view would keep the batch's [T, n, dim] streams
        if rows_t.shape[0]:
            work.append((rows_h, rows_t, state))
    if work:
        mtp_ragged(model, work, logits=False)  # only the state is wanted
