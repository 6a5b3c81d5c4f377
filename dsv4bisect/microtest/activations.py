"""Activations for the micro-tests: synthetic at the scale the real norms give, or captured.

Synthetic (deterministic from the seed, the layer and the site):
- a sublayer input (what attention or the MoE sees) is `z ⊙ w` with z ~ N(0, 1) per channel and w
  the layer's real RMSNorm weight (`attn_norm` / `ffn_norm`): the sublayer input *is* an RMSNorm
  output, unit RMS before the weight, so its per-channel scale is exactly the norm's weight;
- residual streams H [T, n, D] at an mHC site are N(0, 1): the mixes `(H·fnᵀ)·rsqrt(mean H²)` are
  invariant to the scale of H and the collapse is linear in it, so only the real `hc_fn`,
  `hc_base` and `hc_scale` set the errors (their per-channel structure needs captured H);
- token ids are uniform over the vocabulary (hash routing reads the real `tid2eid` with them).

Captured (`--activations FILE`, a safetensors file; every key optional):
    tokens                 int [T]        token ids
    layers.L.hc_attn.in    float [T, n, D] residual streams entering layer L (attention mHC site)
    layers.L.hc_ffn.in     float [T, n, D] residual streams entering layer L's MoE mHC site
    layers.L.attn.in       float [T, D]   attention input (after attn_norm)
    layers.L.ffn.in        float [T, D]   MoE input (after ffn_norm)
A check uses the captured rows where the file has them (cycled when it needs more rows) and
synthetic ones otherwise; every row records which. `capture_activations` writes such a file from
the embedded model.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import torch

from dsv4bisect.errors import ConfigError
from dsv4bisect.reference.config import ModelArgs

SITES = ("hc_attn", "hc_ffn", "attn", "ffn")
_HINT = "an activations file is safetensors with keys `tokens` and `layers.L.<site>.in` " \
        "(sites hc_attn, hc_ffn, attn, ffn); see docs/microtest.md"


def _generator(*parts: object) -> torch.Generator:
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


class Activations:
    """Inputs of the checks, synthetic or captured; `source(...)` says which."""

    def __init__(self, args: ModelArgs, device: torch.device, seed: int = 0,
                 captured: dict[str, torch.Tensor] | None = None, label: str = "synthetic") -> None:
        self.args, self.device, self.seed = args, device, seed
        self.captured = captured or {}
        self.label = label

    @classmethod
    def open(cls, path: str | None, args: ModelArgs, device: torch.device,
             seed: int = 0) -> Activations:
        if path is None:
            return cls(args, device, seed)
        tensors = load_activations(path, args)
        return cls(args, device, seed, tensors, f"captured from {path} (synthetic where absent)")

    def has(self, layer: int, site: str) -> bool:
        return f"layers.{layer}.{site}.in" in self.captured

    def randn(self, *shape: int, key: Sequence[object]) -> torch.Tensor:
        """Deterministic N(0, 1) of `shape` for `key` (on the device)."""
        g = _generator(self.seed, *key)
        return torch.randn(*shape, generator=g).to(self.device)

    def streams(self, layer: int, site: str, T: int) -> tuple[torch.Tensor, str]:
        """Residual streams [T, n, D] at `site` (hc_attn | hc_ffn) of `layer`."""
        key = f"layers.{layer}.{site}.in"
        if key in self.captured:
            return self._rows(self.captured[key], T), "captured"
        a = self.args
        return self.randn(T, a.hc_mult, a.hidden_size, key=(layer, site)), "synthetic"

    def sublayer_input(self, layer: int, site: str, norm_weight: torch.Tensor, T: int,
                       salt: object = 0) -> tuple[torch.Tensor, str]:
        """[T, D] input of attention (`attn`) or the MoE (`ffn`): captured, or z ⊙ norm weight."""
        key = f"layers.{layer}.{site}.in"
        if key in self.captured:  # rows cycled from an offset that depends on the salt
            offset = int.from_bytes(hashlib.sha256(repr(salt).encode()).digest()[:4], "little")
            return self._rows(self.captured[key], T, offset), "captured"
        z = self.randn(T, self.args.hidden_size, key=(layer, site, salt))
        return z * norm_weight.float(), "synthetic"

    def tokens(self, T: int) -> tuple[torch.Tensor, str]:
        if "tokens" in self.captured:
            return self._rows(self.captured["tokens"], T).long(), "captured"
        g = _generator(self.seed, "tokens")
        return torch.randint(0, self.args.vocab_size, (T,), generator=g).to(self.device), \
            "synthetic"

    def _rows(self, t: torch.Tensor, T: int, offset: int = 0) -> torch.Tensor:
        idx = (torch.arange(T) + offset) % t.shape[0]
        out = t[idx].to(self.device)
        return out if not out.dtype.is_floating_point else out.float()


def load_activations(path: str | Path, args: ModelArgs) -> dict[str, torch.Tensor]:
    """Read and validate an activations file (ConfigError naming bad keys and shapes)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"activations file {p} does not exist", _HINT)
    try:
        tensors = load_file(str(p))
    except (SafetensorError, OSError) as exc:
        raise ConfigError(f"{p}: not a safetensors file ({exc})", _HINT) from None
    n, D = args.hc_mult, args.hidden_size
    want = {"hc_attn": (n, D), "hc_ffn": (n, D), "attn": (D,), "ffn": (D,)}
    known = 0
    for key, t in tensors.items():
        if key == "tokens":
            if t.dim() != 1 or t.dtype.is_floating_point or t.numel() == 0 or \
                    int(t.min()) < 0 or int(t.max()) >= args.vocab_size:
                raise ConfigError(f"{p}: `tokens` must be a non-empty 1-D integer tensor of ids "
                                  f"< {args.vocab_size}", _HINT)
            known += 1
            continue
        parts = key.split(".")
        if len(parts) != 4 or parts[0] != "layers" or parts[3] != "in" or parts[2] not in want:
            continue  # other tensors are ignored (a capture may hold more)
        if not parts[1].isdigit() or int(parts[1]) >= args.num_hidden_layers:
            raise ConfigError(f"{p}: `{key}` names a layer this model does not have", _HINT)
        if t.dim() != 1 + len(want[parts[2]]) or tuple(t.shape[1:]) != want[parts[2]] \
                or t.shape[0] == 0 or not t.dtype.is_floating_point:
            raise ConfigError(f"{p}: `{key}` has shape {tuple(t.shape)} ({t.dtype}); expected "
                              f"float [T, {', '.join(map(str, want[parts[2]]))}]", _HINT)
        known += 1
    if known == 0:
        raise ConfigError(f"{p} holds no activation this model can use", _HINT)
    return tensors


def capture_activations(model: torch.nn.Module, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Run the embedded model (a `Transformer`) on `tokens` [T] and return every layer's
    activations in the file format above (save with `safetensors.torch.save_file`)."""
    from dsv4bisect.reference.model import hc_post, hc_pre

    out: dict[str, torch.Tensor] = {"tokens": tokens.detach().cpu().long()}
    hooks = []
    for i, block in enumerate(model.layers):
        def pre(mod: torch.nn.Module, inputs: tuple, i: int = i) -> None:
            out[f"layers.{i}.hc_attn.in"] = inputs[0].detach().float().cpu().contiguous()

        def attn_post(mod: torch.nn.Module, inputs: tuple, o: torch.Tensor, i: int = i,
                      blk: torch.nn.Module = block) -> None:
            out[f"layers.{i}.attn.in"] = inputs[0].detach().float().cpu().contiguous()
            h = out[f"layers.{i}.hc_attn.in"].to(o.device)  # the same math as Block.forward
            _, post, comb = hc_pre(h, blk.hc_attn_fn, blk.hc_attn_scale, blk.hc_attn_base,
                                   blk.a, blk.hc_attn_mixes)
            h_ffn = hc_post(o, h, post, comb)
            out[f"layers.{i}.hc_ffn.in"] = h_ffn.detach().float().cpu().contiguous()

        def ffn_pre(mod: torch.nn.Module, inputs: tuple, i: int = i) -> None:
            out[f"layers.{i}.ffn.in"] = inputs[0].detach().float().cpu().contiguous()

        hooks += [block.register_forward_pre_hook(pre),
                  block.attn.register_forward_hook(attn_post),
                  block.ffn.register_forward_pre_hook(ffn_pre)]
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        for h in hooks:
            h.remove()
    return out
