"""Compile every Triton kernel for a GPU target without a GPU (Triton ships ptxas): catches
kernels that the interpreter accepts but the compiler rejects. Usage: python aot_check.py 90 120
(run without TRITON_INTERPRET; test_triton_compile.py does)."""

from __future__ import annotations

import sys

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from dsv4bisect.kernels import indexer, mhc_mixes, nvfp4, sparse_attention

P32, PBF, PI32, PU8, PF8 = "*fp32", "*bf16", "*i32", "*u8", "*fp8e4nv"


def specs() -> list[tuple[str, object, dict, dict]]:
    """(name, kernel, {arg: type}, {constexpr: value}) at Flash-like settings."""
    sa = sparse_attention._kernels(False)
    ix = indexer._kernels(False)
    mh = mhc_mixes._kernels(False)
    fp = nvfp4._kernels(False)
    out = []
    attn_args = dict(q_ptr=PBF, kv_ptr=PBF, idx_ptr=PI32, o_ptr=PBF, lse_ptr=P32, lsum_ptr=P32,
                     H="i32", K="i32", S_total="i32", s_offset="i32", scale="fp32",
                     stride_qt="i32", stride_qh="i32", stride_kv="i32", stride_it="i32")
    split_args = {**attn_args, "TILES": "i32"}
    dense = dict(D=512, A_DIM=512, BLOCK_A=512, BLOCK_B=16, HAS_B=False, FP8=False, PAGE=1,
                 PAGE_BYTES=0)
    model1 = dict(D=512, A_DIM=448, BLOCK_A=512, BLOCK_B=64, HAS_B=True, FP8=True, PAGE=64,
                  PAGE_BYTES=37440)
    tiny = dict(D=64, A_DIM=64, BLOCK_A=64, BLOCK_B=16, HAS_B=False, FP8=False, PAGE=1,
                PAGE_BYTES=0)
    for name, geo, kv, op in (("dense-bf16", dense, PBF, tl.bfloat16),
                              ("model1", model1, PU8, tl.bfloat16),
                              ("tiny-fp32", tiny, P32, tl.float32)):
        for tile in (64, 32) if geo["D"] >= 256 else (64,):  # 32: the SM120 choice
            out.append((f"split_partials[{name},tile{tile}]", sa.split_partials,
                        {**split_args, "kv_ptr": kv},
                        dict(geo, TILE_N=tile, BLOCK_H=32 if geo["D"] >= 256 else 16,
                             OP_DTYPE=op, ROUND_OPS=op == tl.bfloat16, ROUND_PARTIAL=True)))
    for name, geo, kv in (("dense", dense, PBF), ("model1", model1, PU8)):
        out.append((f"baseline_partial[{name}]", sa.baseline_partial, {**attn_args, "kv_ptr": kv},
                    dict(geo, BLOCK_T=16, ROUND_PARTIAL=True)))
    for nr in (False, True):
        out.append((f"merge_partials[{nr}]", sa.merge_partials,
                    dict(o_ptr=PBF, lse_ptr=P32, lsum_ptr=P32, sink_ptr=P32, out_ptr=P32,
                         H="i32", D="i32", S="i32", stride_ot="i32", stride_oh="i32"),
                    dict(NO_RESCALE=nr, ROUND_OUT=True, BLOCK_H=32, BLOCK_D=64)))
    for op, bf in ((tl.bfloat16, True), (tl.float32, False)):
        out.append((f"indexer[{op}]", ix.logits,
                    dict(q_ptr=PBF if bf else P32, w_ptr=P32, k_ptr=PBF if bf else P32,
                         nvis_ptr=PI32, out_ptr=P32, T="i32", H="i32", d="i32", S="i32",
                         stride_qt="i32", stride_qh="i32", stride_wt="i32", stride_k="i32",
                         stride_ot="i32"),
                    dict(BLOCK_T=64, BLOCK_S=64, BLOCK_D=128, OP_DTYPE=op, BF16_DOTS=bf)))
    for op, fused in ((tl.bfloat16, True), (tl.float32, False)):
        out.append((f"mhc[{op}]", mh.mixes,
                    dict(x_ptr=PBF, fn_ptr=P32, out_ptr=P32, part_ptr=P32, sq_ptr=P32,
                         T="i32", M="i32", KD="i32", K_PER_SPLIT="i32", eps="fp32",
                         stride_xt="i32", stride_fm="i32", stride_ot="i32"),
                    dict(BLOCK_T=64, BLOCK_M=32, BLOCK_K=64, OP_DTYPE=op,
                         PREC="tf32x3" if op == tl.float32 else "ieee",
                         ROUND_OPS=op == tl.bfloat16, FUSED=fused)))
    out.append(("mhc_reduce", mh.reduce,
                dict(part_ptr=P32, sq_ptr=P32, out_ptr=P32, T="i32", M="i32", KD="i32",
                     KSPLIT="i32", eps="fp32", stride_ot="i32"),
                dict(BLOCK_T=64, BLOCK_M=32, ROUND_OUT=True)))
    out.append(("nvfp4_quantize", fp.quantize,
                dict(x_ptr=PBF, g_ptr=P32, codes_ptr=PU8, scales_ptr=PF8, n_blocks="i32",
                     blocks_per_row="i32", g_row_stride="i32"), dict(BLOCK_G=64)))
    out.append(("nvfp4_dequantize", fp.dequantize,
                dict(codes_ptr=PU8, scales_ptr=PF8, g_ptr=P32, out_ptr=P32, n_blocks="i32",
                     blocks_per_row="i32", g_row_stride="i32"), dict(BLOCK_G=64)))
    out.extend(extra_specs())
    return out


def extra_specs() -> list:
    """Kernels of the SGLang layouts and the NVFP4 GEMM (issue 6)."""
    ixp = indexer._paged_kernels(False)
    fp = nvfp4._kernels(False)
    out = []
    for bf in (False, True):
        out.append((f"indexer_paged[{bf}]", ixp.paged,
                    dict(q_ptr=PU8, pages_ptr=PU8, w_ptr=P32, lens_ptr=PI32, pt_ptr=PI32,
                         out_ptr=P32, H="i32", max_seq_len="i32", stride_qb="i32",
                         stride_wb="i32", stride_pt="i32", stride_ob="i32"),
                    dict(BLOCK_H=64, OP_DTYPE=tl.float8e4nv, BF16_DOTS=bf)))
    out.append(("nvfp4_linear", fp.linear,
                dict(x_ptr=PBF, codes_ptr=PU8, scales_ptr=PF8, g_ptr=P32, out_ptr=P32, T="i32",
                     N="i32", K="i32", stride_xt="i32", stride_ot="i32", g_stride="i32"),
                dict(BLOCK_T=128, BLOCK_N=64, BLOCK_K=64, OP_DTYPE=tl.bfloat16)))
    return out


SMEM_LIMIT = {90: 232448, 120: 101376}  # bytes per block: H100/H200, RTX PRO 6000 (99 KB)


def compile_all(archs: list[int]) -> list[str]:
    failures = []
    for arch in archs:
        target = GPUTarget("cuda", arch, 32)
        for name, kernel, sig, consts in specs():
            if arch == 120 and "tile64" in name:
                continue  # the wrappers use 32-key tiles for 512-dim rows on SM120
            signature = {**sig, **{k: "constexpr" for k in consts}}
            wide = consts.get("BLOCK_A", 0) >= 256  # the launch options the wrappers use
            options = dict(num_warps=8 if wide else 4, num_stages=1 if wide else 2)
            try:
                c = triton.compile(ASTSource(kernel, signature, constexprs=consts),
                                   target=target, options=options)
            except Exception as e:  # noqa: BLE001 - report every failing kernel
                failures.append(f"sm_{arch} {name}: {type(e).__name__}: {str(e)[:400]}")
                continue
            if c.metadata.shared > SMEM_LIMIT[arch]:
                failures.append(f"sm_{arch} {name}: {c.metadata.shared} B of shared memory")
            print(f"sm_{arch} {name}: shared {c.metadata.shared} B", flush=True)
    return failures


if __name__ == "__main__":
    fails = compile_all([int(a) for a in sys.argv[1:]] or [90])
    print("\n".join(fails) if fails else "ok")
    sys.exit(1 if fails else 0)
