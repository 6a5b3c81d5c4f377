"""GPU check of the kernel hooks against SGLang's own torch versions, at DeepSeek-V4 shapes.

    python tests/sglang/gpu_hooks_check.py --wheels DIR --out OUT_DIR     # ~2-3 min on an H200

For each SGLang wheel in DIR (e.g. tests/sglang/wheels.HOOK_VERSIONS: 0.5.13, 0.5.14, 0.5.16,
0.5.23; read, never installed; a zip holding only the modules the tree reads will do): builds
the synthetic `sglang` tree from the wheel (tests/sglang/sglang_tree.py), keeps SGLang's torch
function, installs the patch through the real installer and HookRegistry, and compares on CUDA:
- mma-decode (`flash_mla_with_kvcache_sm120` — under sglang/kernels/ops from 0.5.16 — vs
  SGLang's torch `_sm120_sparse_decode_fwd`, selected by SGLANG_SM120_TRITON_FLASHMLA=0 /
  SGLANG_SM120_FLASHMLA_BACKEND=torch), FP8 MODEL1 pages built in SGLang's layout:
  SWA window 128 + C4 top-512 / C128 all entries, heads 64 (TP1) and 8 (TP8), decode batches
  and an extend batch of 2048 query rows (SM120 sends prefill chunks through this entry);
- triton-indexer (`fp8_paged_mqa_logits_torch_sm120`), 64 heads × 128, up to 32768 entries
  (the variant with the release's own rounding — fp32 up to 0.5.15, bf16 from 0.5.16 — must
  match it to fp32 noise, the other differ by bf16 rounding);
- mhc-bf16 (`hc_pre`, torch path; on `DeepseekV4DecoderLayerBase` from 0.5.23) at
  x [T, 4, 4096], fn [24, 16384];
each also captured in a CUDA graph and replayed on new inputs written into the captured
buffers. Writes OUT_DIR/gpu_hooks_check.{json,md}; exit 1 if any check fails.
Needs torch + Triton (2.11 / 3.6 as pinned by SGLang 0.5.13), no network, no pydantic.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import importlib  # noqa: E402

import gpu_paths  # noqa: E402, F401  (sys.path and the package's layout)
import torch  # noqa: E402
from hookenv import install  # noqa: E402
from sglang_tree import SglangTree, decoder_layer  # noqa: E402

from dsv4bisect.sglang_hooks.targets import mla_module  # noqa: E402

ROWS: list[dict] = []
DEV = "cuda"
GRAPH_TOL = 1e-6
SMOKE = False  # --smoke: CPU, small shapes, kernel references (checks this script's plumbing)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def timed(fn: Callable[[], object], reps: int = 10) -> float | None:
    if DEV != "cuda":
        return None
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def record(version: str, check: str, shape: str, err: float, limit: tuple[float, float],
           ms_hook: float | None = None, ms_ref: float | None = None, graph: float | None = None,
           ) -> None:
    # graph: the replayed graph against the same hook run eagerly on the new inputs
    ok = limit[0] <= err < limit[1] and (graph is None or graph <= GRAPH_TOL)
    ROWS.append(dict(sglang=version, check=check, shape=shape, rel_err=err,
                     bounds=list(limit), graph_rel_err=graph, ms_hook=ms_hook, ms_sglang=ms_ref,
                     ok=ok))
    print(f"{'ok ' if ok else 'FAIL'} {version} {check:28s} {shape:34s} err {err:.2e}"
          + (f" graph {graph:.2e}" if graph is not None else "")
          + (f"  {ms_hook:.3f} ms vs SGLang torch {ms_ref:.3f} ms" if ms_hook else ""),
          flush=True)


def graph_replay(fn: Callable[[], torch.Tensor], refill: Callable[[], None]) -> torch.Tensor:
    """Capture fn() in a CUDA graph, refill the captured inputs in place, replay."""
    if DEV != "cuda":
        refill()
        return fn()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    refill()
    g.replay()
    torch.cuda.synchronize()
    return out


# ------------------------------------------------------------------------------- mma-decode
def decode_case(B: int, H: int, n_extra: int, extra_page: int, pool: int, seed: int) -> dict:
    from dsv4bisect.kernels.sparse_attention import model1_pack

    g = torch.Generator(device=DEV).manual_seed(seed)
    dev = DEV

    def pages(rows: int, P: int) -> torch.Tensor:
        raw = model1_pack(torch.randn(rows, 512, device=dev, generator=g), P)
        return raw.view(torch.float8_e4m3fn).as_strided((raw.shape[0], P, 1, 584),
                                                        (raw.shape[1], 584, 584, 1))

    swa_rows = max(256, B * 4)
    kw = dict(q=(torch.randn(B, 1, H, 512, device=dev, generator=g) * 0.3).to(torch.bfloat16),
              k_cache=pages(swa_rows, 256), head_dim_v=512, softmax_scale=512 ** -0.5,
              indices=torch.randint(0, swa_rows, (B, 1, 128), device=dev, generator=g,
                                    dtype=torch.int32),
              topk_length=torch.randint(64, 129, (B,), device=dev, generator=g,
                                        dtype=torch.int32),
              attn_sink=torch.randn(H, device=dev, generator=g),
              extra_k_cache=pages(pool, extra_page),
              extra_indices_in_kvcache=torch.randint(0, pool, (B, 1, n_extra), device=dev,
                                                     generator=g, dtype=torch.int32),
              extra_topk_length=torch.randint(n_extra // 2, n_extra + 1, (B,), device=dev,
                                              generator=g, dtype=torch.int32))
    return kw


def check_decode(version: str, wheel: Path) -> None:
    cases = [(32, 64, 512, 64, 8192, "C4 top-512, TP1"), (32, 8, 1024, 2, 2048, "C128 all, TP8"),
             (2048, 8, 512, 64, 8192, "extend 2048 rows, TP8")]
    if SMOKE:
        cases = [(2, 16, 96, 64, 512, "smoke C4"), (2, 8, 70, 2, 256, "smoke C128")]
    bounds = {"split-k-fp32": (0.0, 1e-2), "split-k": (0.0, 2e-2),
              "merge-no-rescale": (5e-2, 10.0)}
    for variant, lim in bounds.items():
        with SglangTree(wheel) as t:
            mla = importlib.import_module(mla_module(t.layout))
            stock = mla.flash_mla_with_kvcache_sm120
            install(t.version, {"mma-decode": variant})
            hooked = mla.flash_mla_with_kvcache_sm120
            for B, H, n_extra, page, pool, label in cases:
                if variant != "split-k" and B > 32:
                    continue
                kw = decode_case(B, H, n_extra, page, pool, seed=B + H)
                ref = stock(**kw)[0]
                out = hooked(**kw)[0]
                ms_h, ms_r = timed(lambda: hooked(**kw)), timed(lambda: stock(**kw), 3)
                graph = None
                if B <= 32:  # decode batch sizes are captured at startup
                    new = decode_case(B, H, n_extra, page, pool, seed=99)

                    def refill() -> None:
                        for k, v in kw.items():
                            if isinstance(v, torch.Tensor):
                                v.copy_(new[k])

                    got = graph_replay(lambda: hooked(**kw)[0], refill)
                    graph = rel(got, hooked(**new)[0])
                record(version, f"mma-decode:{variant}", f"B{B} H{H} {label}", rel(out, ref),
                       lim, ms_h, ms_r, graph)


# --------------------------------------------------------------------------- triton-indexer
def indexer_case(B: int, max_seq: int, seed: int) -> tuple:
    from dsv4bisect.kernels.indexer import pack_indexer_pages

    g = torch.Generator(device=DEV).manual_seed(seed)
    n_pages = math.ceil(max_seq / 64)
    pages = pack_indexer_pages(torch.randn(n_pages * 64 + 640, 128, device=DEV, generator=g))
    pt = torch.stack([torch.randperm(pages.shape[0], device=DEV, generator=g)[:n_pages]
                      for _ in range(B)]).to(torch.int32)
    q = (torch.randn(B, 1, 64, 128, device=DEV, generator=g) * 4).to(torch.float8_e4m3fn)
    w = torch.randn(B, 64, device=DEV, generator=g) / 64.0
    lens = torch.randint(1, max_seq + 1, (B, 1), device=DEV, generator=g, dtype=torch.int32)
    return q, pages, w, lens, pt, max_seq


def check_indexer(version: str, wheel: Path) -> None:
    for variant in ("fp32", "bf16"):
        with SglangTree(wheel) as t:
            # 0.5.13-0.5.15 upcast to fp32 (the fp32 variant matches to 1e-7); from 0.5.16 stock
            # is a bf16 bmm whose cuBLAS rounding is close to, not equal to, the bf16 variant
            # (H200: 7.5e-4 relative); the other variant differs by bf16 rounding
            bf16_stock = t.layout >= "0.5.16"
            lim = {("fp32", False): (0.0, 1e-5), ("bf16", True): (0.0, 1e-3)}.get(
                (variant, bf16_stock), (1e-5, 1e-2))
            import sglang.srt.layers.attention.dsv4.indexer as ix

            stock = ix.fp8_paged_mqa_logits_torch_sm120
            install(t.version, {"triton-indexer": variant})
            hooked = ix.fp8_paged_mqa_logits_torch_sm120
            for B, S in ((4, 300),) if SMOKE else ((32, 32768), (256, 8192)):
                args = indexer_case(B, S, seed=B)
                ref = stock(*args[:5], None, S, False)
                out = hooked(*args[:5], None, S, False)
                fin = torch.isfinite(ref)
                same_mask = bool(torch.equal(fin, torch.isfinite(out)))
                err = rel(out[fin], ref[fin]) if same_mask else float("inf")
                graph = None
                if B in (4, 32):
                    new = indexer_case(B, S, seed=7)
                    arg = list(args)

                    def refill() -> None:
                        for dst, src in zip(arg[:5], new[:5]):
                            dst.copy_(src)

                    got = graph_replay(lambda: hooked(*arg[:5], None, S, False), refill)
                    r2 = hooked(*new[:5], None, S, False)
                    f2 = torch.isfinite(r2)
                    graph = rel(got[f2], r2[f2]) if torch.equal(f2, torch.isfinite(got)) \
                        else float("inf")
                record(version, f"triton-indexer:{variant}", f"B{B} 64x128 S{S}", err, lim,
                       timed(lambda: hooked(*args[:5], None, S, False)),
                       timed(lambda: stock(*args[:5], None, S, False), 3), graph)


# -------------------------------------------------------------------------------- mhc-bf16
def check_mhc(version: str, wheel: Path) -> None:
    with SglangTree(wheel) as t:
        import sglang.srt.models.deepseek_v4 as v4

        cls = v4.DeepseekV4DecoderLayer
        stock = cls.hc_pre
        install(t.version, {"mhc-bf16": "bf16"})
        layer = decoder_layer(cls)
        g = torch.Generator(device=DEV).manual_seed(0)
        D = 256 if SMOKE else 4096
        fn = torch.randn(24, 4 * D, device=DEV, generator=g) * (4 * D) ** -0.5
        scale = torch.tensor([0.8, 1.1, 0.9], device=DEV)
        base = torch.randn(24, device=DEV, generator=g) * 0.1
        for T in (32,) if SMOKE else (32, 4096):
            x = torch.randn(T, 4, D, device=DEV, generator=g).to(torch.bfloat16)
            ref = stock(layer, x, fn, scale, base)
            out = layer.hc_pre(x, fn, scale, base)
            errs = [rel(a, b) for a, b in zip(out[:3], ref[:3])]
            graph = None
            if T == 32:
                x2 = torch.randn(x.shape, device=DEV, generator=g).to(torch.bfloat16)
                got = graph_replay(lambda: layer.hc_pre(x, fn, scale, base)[0],
                                   lambda: x.copy_(x2))
                graph = rel(got, layer.hc_pre(x2, fn, scale, base)[0])
            for name, e in zip(("y", "post", "comb"), errs):
                record(version, f"mhc-bf16 {name}", f"x [{T}, 4, {D}]", e, (1e-6, 3e-2),
                       timed(lambda: layer.hc_pre(x, fn, scale, base)) if name == "y" else None,
                       timed(lambda: stock(layer, x, fn, scale, base), 3) if name == "y"
                       else None, graph if name == "y" else None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--wheels", type=Path, required=True, help="folder with sglang-*.whl")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--smoke", action="store_true",
                    help="CPU dry run at small shapes with the kernel references")
    args = ap.parse_args()
    global DEV, SMOKE
    if args.smoke:
        DEV, SMOKE = "cpu", True
    elif not torch.cuda.is_available():
        print("needs CUDA (or --smoke)", file=sys.stderr)
        return 2
    import triton

    wheels = {w.name.split("-")[1]: w for w in sorted(args.wheels.glob("sglang-*.whl"))}
    if not wheels:
        print(f"no sglang wheel in {args.wheels}", file=sys.stderr)
        return 2
    t0 = time.time()
    env = dict(torch=torch.__version__, triton=triton.__version__, wheels=sorted(wheels),
               gpu=torch.cuda.get_device_name() if DEV == "cuda" else "cpu (smoke)")
    print(env, flush=True)
    for version, wheel in wheels.items():
        check_decode(version, wheel)
        check_indexer(version, wheel)
        check_mhc(version, wheel)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_hooks_check.json").write_text(json.dumps(dict(env=env, rows=ROWS,
                                                               seconds=time.time() - t0), indent=1))
    lines = ["| SGLang | check | shape | rel err | graph replay err | hook ms "
             "| SGLang torch ms | ok |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]

    def f(v: float | None, p: str) -> str:
        return "" if v is None else format(v, p)

    for r in ROWS:
        lines.append(f"| {r['sglang']} | {r['check']} | {r['shape']} | {r['rel_err']:.2e} | "
                     f"{f(r['graph_rel_err'], '.2e')} | {f(r['ms_hook'], '.3f')} | "
                     f"{f(r['ms_sglang'], '.3f')} | {'yes' if r['ok'] else 'NO'} |")
    (args.out / "gpu_hooks_check.md").write_text(f"{env}\n\n" + "\n".join(lines) + "\n")
    bad = [r for r in ROWS if not r["ok"]]
    print(f"{len(ROWS) - len(bad)} passed, {len(bad)} failed in {time.time() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
