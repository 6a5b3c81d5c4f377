"""The vLLM hooks' torch paths against vLLM's own torch implementations of the same ops, from
`.py` slices of the wheels (no vLLM install): docs/vllm.md, "On a GPU".

    python tests/vllm/gpu_vllm_check.py --make-slices .whl/vllm       # here: from the wheels
    python tests/vllm/gpu_vllm_check.py --slices .whl/vllm --device cuda --out $OUT
    python tests/vllm/gpu_vllm_check.py --slices .whl/vllm --device cpu --smoke

Per release that has them:
- mHC (`model_executor/kernels/mhc/torch.py`, 0.22.0+): the mhc-bf16 hook's pre block with
  fp32 mixes against `mhc_pre_torch` (must agree to fp32 rounding: the hook's code path is
  vLLM's reference), with the patch's bf16 mixes (the patch's size, reported), the fused
  post+pre (vLLM's post + the hook's pre) against `mhc_post_torch` then `mhc_pre_torch`, the
  first layer's broadcast pre, the pre with the fused RMSNorm against `mhc_pre_torch` + an
  fp32 RMSNorm; on CUDA the hook captured in a CUDA graph and replayed on new inputs, and
  traced by Dynamo with fullgraph (vLLM compiles the model so);
- routing (`fused_moe/router/fused_topk_bias_router.py`): the embedded engine's hash routing
  (sqrt-softplus, renormalised, x rsf: the hash-topk-scaling patch's `topk` numerics) against
  vLLM's torch fallback where one exists (0.20.0's torch tail, 0.22.0/0.24.0's
  `_topk_softplus_sqrt_torch`), and the `double-scale` hook around vLLM's function (exactly
  x rsf on hash rows, ids unchanged; 0.28.0/0.34.0 through the softmax torch tail).
DeepSeek-V4-Flash shapes: 4 streams of 4096, 24 mixes, Sinkhorn 20, 256 experts, top 6,
vocabulary 129280, rsf 1.5. Prints a table; writes vllm_hooks.json under --out. torch only.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dsv4bisect.vllm_hooks import mhc as hooks_mhc  # noqa: E402
from dsv4bisect.vllm_hooks import routing as hooks_routing  # noqa: E402

RELEASES = ("0.20.0", "0.22.0", "0.24.0", "0.28.0", "0.34.0")
SLICES = ("vllm/model_executor/kernels/mhc/torch.py",
          "vllm/model_executor/layers/fused_moe/router/fused_topk_bias_router.py")
HC, D, M = 4, 4096, 24
EPS, POST_MULT, SINKHORN = 1e-6, 2.0, 20
EXPERTS, TOPK, VOCAB, RSF = 256, 6, 129280, 1.5
EXACT = 1e-5  # fp32-rounding agreement


# -- slices -------------------------------------------------------------------------------------
def make_slices(dest: Path) -> None:
    """The files the check reads, from the wheels tests/vllm/vllm_wheels.py keeps (run here)."""
    import zipfile

    sys.path.insert(0, str(ROOT / "tests" / "vllm"))
    from vllm_wheels import fetch_wheel

    total = 0
    for release in RELEASES:
        wheel, why = fetch_wheel(release)
        if wheel is None:
            raise SystemExit(f"{release}: {why}")
        with zipfile.ZipFile(wheel) as z:
            for rel in SLICES:
                if rel in z.namelist():
                    out = dest / release / rel
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(z.read(rel))
                    total += out.stat().st_size
    print(f"slices of {len(RELEASES)} releases in {dest}: {total / 1024:.0f} KiB")


def load_mhc_torch(root: Path) -> types.ModuleType | None:
    path = root / SLICES[0]
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location(f"vllm_mhc_torch_{root.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports torch only
    return module


class _Aiter:
    """vLLM's ROCm AITER switch, on: the path into fused_topk_bias's torch tail."""

    @staticmethod
    def is_fused_moe_enabled() -> bool:
        return True


def load_router(root: Path) -> dict[str, Any]:
    """The router file's module-level functions, run against torch with stand-ins for what
    they import from vLLM (the AITER switch on, batch invariance off, no custom ops)."""
    text = (root / SLICES[1]).read_text()
    tree = ast.parse(text)
    keep = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    for fn in keep:
        fn.decorator_list = []
    namespace: dict[str, Any] = {
        "torch": torch, "F": F, "rocm_aiter_ops": _Aiter,
        "envs": types.SimpleNamespace(VLLM_BATCH_INVARIANT=False),
        "ops": None, "get_moe_padding_mask": lambda n: None,
        "can_use_dsv4_topk": lambda *a, **k: False, "dsv4_topk": None,
    }
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(root / SLICES[1]), "exec"),
         namespace)
    return namespace


# -- measures -----------------------------------------------------------------------------------
def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    b32 = b.float()
    return float((a.float() - b32).abs().max() / b32.abs().max().clamp_min(1e-30))


def worst(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    return max(rel(a, b) for a, b in pairs)


def inputs(t: int, dev: str, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cpu").manual_seed(seed)
    return {"residual": torch.randn(t, HC, D, generator=g).bfloat16().to(dev),
            "fn": (torch.randn(M, HC * D, generator=g) * 0.02).to(dev),
            "hc_scale": (torch.rand(3, generator=g) + 0.5).to(dev),
            "hc_base": (torch.randn(M, generator=g) * 0.1).to(dev),
            "x": torch.randn(t, D, generator=g).bfloat16().to(dev),
            "norm": (1 + 0.1 * torch.randn(D, generator=g)).bfloat16().to(dev)}


def _args(i: dict[str, torch.Tensor]) -> tuple[Any, ...]:
    return (i["fn"], i["hc_scale"], i["hc_base"], EPS, EPS, EPS, POST_MULT, SINKHORN)


def hook_pre(i: dict[str, torch.Tensor], mode: str, residual: torch.Tensor | None = None,
             norm: bool = False) -> tuple[torch.Tensor, ...]:
    return hooks_mhc.mhc_pre(i["residual"] if residual is None else residual, *_args(i),
                             norm_weight=i["norm"] if norm else None, norm_eps=EPS, mode=mode)


def mhc_rows(release: str, mod: types.ModuleType, dev: str, sizes: tuple[int, ...]
             ) -> list[dict[str, Any]]:
    rows = []

    def row(op: str, t: int, value: float, limit: float | None) -> None:
        rows.append({"release": release, "op": op, "tokens": t, "rel_err": value,
                     "limit": limit, "ok": limit is None or value <= limit})

    for t in sizes:
        i = inputs(t, dev, 1000 + t)
        ref = mod.mhc_pre_torch(i["residual"], *_args(i))
        row("mhc pre, fp32 mixes vs mhc_pre_torch", t, worst(list(zip(hook_pre(i, "fp32"),
                                                                       ref))), EXACT)
        row("mhc pre, bf16 mixes (the patch) vs mhc_pre_torch", t,
            worst(list(zip(hook_pre(i, "bf16"), ref))), None)
        # the fused post+pre: vLLM's post (torch.py's formula), then the hook's pre
        post, comb, _ = ref
        cur_ref = mod.mhc_post_torch(i["x"], i["residual"], post, comb)
        fused = hooks_mhc.fused_post_pre(mod.mhc_post_torch, i["x"], i["residual"], post, comb,
                                         *_args(i), mode="fp32")
        row("fused post+pre (hook) vs mhc_post_torch + mhc_pre_torch", t,
            worst(list(zip(fused, (cur_ref, *mod.mhc_pre_torch(cur_ref, *_args(i)))))), EXACT)
        streams = i["x"].unsqueeze(1).expand(t, HC, D).contiguous()
        bc = hooks_mhc.pre_broadcast(i["x"], *_args(i), mode="fp32")
        row("first-layer broadcast pre (hook) vs mhc_pre_torch on the copies", t,
            worst(list(zip(bc, (streams, *mod.mhc_pre_torch(streams, *_args(i)))))), EXACT)
        pre_mix = _pre_mix(i)
        collapsed = (pre_mix.unsqueeze(-1) * i["residual"].float()).sum(1)
        normed = collapsed * torch.rsqrt(collapsed.square().mean(-1, keepdim=True) + EPS) \
            * i["norm"].float()
        row("pre with the fused RMSNorm (hook) vs mhc_pre_torch's collapse + fp32 RMSNorm", t,
            rel(hook_pre(i, "fp32", norm=True)[2], normed.bfloat16()), 1e-2)
    return rows


def _pre_mix(i: dict[str, torch.Tensor]) -> torch.Tensor:
    """mhc_pre_torch's pre weights (its formula; the check's own fp32 collapse needs them)."""
    x = i["residual"].flatten(1).float()
    mixes = (x @ i["fn"].T) * torch.rsqrt(x.square().mean(-1, keepdim=True) + EPS)
    return torch.sigmoid(mixes[:, :HC] * i["hc_scale"][0] + i["hc_base"][:HC]) + EPS


def compile_rows(release: str, dev: str) -> list[dict[str, Any]]:
    """The hook under vLLM's machinery: Dynamo fullgraph and (CUDA) graph capture."""
    rows = []
    i = inputs(32, dev, 7)
    try:
        compiled = torch.compile(lambda r: hook_pre(i, "bf16", residual=r), fullgraph=True,
                                 backend="eager")
        got = compiled(i["residual"])
        value, ok = worst(list(zip(got, hook_pre(i, "bf16")))), True
    except Exception as exc:  # noqa: BLE001 - a graph break is the finding
        value, ok = float("nan"), False
        print(f"  dynamo fullgraph failed: {type(exc).__name__}: {str(exc)[:200]}")
    rows.append({"release": release, "op": "mhc pre hook traced by Dynamo (fullgraph)",
                 "tokens": 32, "rel_err": value, "limit": 0.0, "ok": ok and value == 0.0})
    if dev == "cuda":
        static = i["residual"].clone()
        torch.cuda.synchronize()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            hook_pre(i, "bf16", residual=static)  # warm-up off the default stream
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = hook_pre(i, "bf16", residual=static)
        fresh = inputs(32, dev, 8)["residual"]
        static.copy_(fresh)
        graph.replay()
        want = hook_pre(i, "bf16", residual=fresh)
        value = worst(list(zip(out, want)))
        rows.append({"release": release, "op": "mhc pre hook captured in a CUDA graph, replayed",
                     "tokens": 32, "rel_err": value, "limit": 0.0, "ok": value == 0.0})
    return rows


def timing_rows(release: str, mod: types.ModuleType, dev: str) -> list[dict[str, Any]]:
    if dev != "cuda":
        return []
    i = inputs(512, dev, 9)

    def ms(fn: Callable[[], Any]) -> float:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / 20 * 1e3

    return [{"release": release, "op": "time: mhc pre at T=512 (ms): hook bf16 / mhc_pre_torch",
             "tokens": 512, "rel_err": None, "limit": None, "ok": True,
             "ms_hook": ms(lambda: hook_pre(i, "bf16")),
             "ms_vllm_torch": ms(lambda: mod.mhc_pre_torch(i["residual"], *_args(i)))}]


def routing_rows(release: str, router: dict[str, Any], dev: str, t: int
                 ) -> list[dict[str, Any]]:
    from dsv4bisect.reference.config import ModelArgs
    from dsv4bisect.reference.model import Gate

    g = torch.Generator().manual_seed(11)
    hidden = torch.randn(t, 64, generator=g).to(dev)
    table = torch.randint(0, EXPERTS, (VOCAB, TOPK), generator=g).to(dev)
    tokens = torch.randint(0, VOCAB, (t,), generator=g).to(dev)
    args = ModelArgs.preset("tiny")
    args = type(args)(**{**args.__dict__, "hidden_size": 64, "n_routed_experts": EXPERTS,
                         "num_experts_per_tok": TOPK, "vocab_size": VOCAB,
                         "scoring_func": "sqrtsoftplus", "norm_topk_prob": True})
    gate = Gate(args, 0).to(dev)
    with torch.no_grad():
        gate.weight.copy_(torch.randn(EXPERTS, 64, generator=g).to(dev) * 0.5)
        gate.tid2eid.copy_(table)
    logits = hidden @ gate.weight.T
    w_emb, ids_emb = gate(hidden, tokens)
    rows = []
    fallback = None
    if "_topk_softplus_sqrt_torch" in router:  # 0.22.0 / 0.24.0
        w = torch.empty(t, TOPK, device=dev)
        i = torch.empty(t, TOPK, dtype=torch.int64, device=dev)
        fallback = lambda: router["_topk_softplus_sqrt_torch"](  # noqa: E731
            w.clone(), i.clone(), i.clone(), logits, True, None, tokens, table, RSF)
    elif release == "0.20.0":  # the torch tail takes sqrt-softplus there
        fallback = lambda: router["fused_topk_bias"](  # noqa: E731
            hidden, logits, "sqrtsoftplus", None, TOPK, True, torch.int64, tokens, table, RSF)
    if fallback is not None:
        w_v, ids_v = fallback()
        rows.append({"release": release, "op": "hash routing: embedded engine x rsf vs vLLM's "
                     "torch fallback", "tokens": t, "rel_err": rel(w_emb * RSF, w_v),
                     "limit": EXACT, "ok": rel(w_emb * RSF, w_v) <= EXACT
                     and bool((ids_v.long() == ids_emb.long()).all())})
        func, scoring = (lambda *a, **k: fallback()), "sqrtsoftplus"
    else:  # 0.28.0 / 0.34.0: sqrt-softplus has no torch path; the softmax tail does
        func, scoring = router["fused_topk_bias"], "softmax"
    hooks_routing.RSF["model"] = RSF
    plain = func(hidden, logits, scoring, None, TOPK, True, None, tokens, table, RSF)
    doubled = hooks_routing.plan("double-scale", release, _NoRecord()).hooks[1].fn(
        func, hidden, logits, scoring, None, TOPK, True, None, tokens, table, RSF)
    off = float((doubled[0] - plain[0] * RSF).abs().max())
    rows.append({"release": release, "op": f"double-scale hook around vLLM's routing "
                 f"({scoring}): weights - rsf x vLLM's", "tokens": t, "rel_err": off,
                 "limit": 0.0, "ok": off == 0.0 and bool((doubled[1] == plain[1]).all())})
    return rows


class _NoRecord:
    def called(self, target: str) -> None:
        pass

    def log(self, key: str, value: Any) -> None:
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slices", type=Path, default=ROOT / ".whl" / "vllm")
    ap.add_argument("--make-slices", type=Path, default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true", help="small token counts (CPU)")
    a = ap.parse_args()
    if a.make_slices is not None:
        make_slices(a.make_slices)
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False  # vLLM's torch references run fp32 GEMMs
    sizes = (1, 8) if a.smoke else (1, 32, 512)
    rows: list[dict[str, Any]] = []
    for release in RELEASES:
        root = a.slices / release
        if not root.is_dir():
            print(f"{release}: no slices in {root}")
            continue
        mod = load_mhc_torch(root)
        if mod is not None:
            rows += mhc_rows(release, mod, a.device, sizes)
            rows += compile_rows(release, a.device)
            rows += timing_rows(release, mod, a.device)
        rows += routing_rows(release, load_router(root), a.device, 64 if a.smoke else 4096)
    device = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
    print(f"{'release':8} {'T':>5} {'rel err':>10} {'limit':>8} ok  op  ({device}, torch "
          f"{torch.__version__})")
    for r in rows:
        err = "-" if r["rel_err"] is None else f"{r['rel_err']:.2e}"
        lim = "report" if r["limit"] is None else f"{r['limit']:.0e}"
        extra = f"  hook {r['ms_hook']:.3f} ms, vLLM torch {r['ms_vllm_torch']:.3f} ms" \
            if "ms_hook" in r else ""
        ok = "yes" if r["ok"] else "NO"
        print(f"{r['release']:8} {r['tokens']:>5} {err:>10} {lim:>8} {ok:3} {r['op']}{extra}")
    failed = [r for r in rows if not r["ok"]]
    print(f"{len(rows) - len(failed)} of {len(rows)} checks passed")
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "vllm_hooks.json").write_text(json.dumps(
            {"device": device, "torch": torch.__version__, "rows": rows}, indent=1))
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
