"""Compile every Triton kernel for a GPU target without a GPU (Triton ships ptxas): catches
kernels that the interpreter accepts but the compiler rejects. Usage: python aot_check.py 90 120
(run without TRITON_INTERPRET; test_triton_compile.py does). `--facts` adds what the SASS says
(registers, stack, wgmma vs mma.sync, cp.async, spills); `--only NAME` picks kernels."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

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
    split_args = dict(q_ptr=PBF, kv0_ptr=PBF, idx0_ptr=PI32, o_ptr=P32, lse_ptr=P32,
                      lsum_ptr=P32, sink_ptr=P32, out_ptr=P32, kv1_off="i64", idx1_off="i64",
                      H="i32", K0="i32", K1="i32", N0="i32", N1="i32", UPP="i32", S_prog="i32",
                      scale="fp32", psh0="i32", pby0="i32", psh1="i32", pby1="i32",
                      stride_qt="i32", stride_qh="i32", stride_kv0="i32",
                      stride_kv1="i32", stride_i0="i32", stride_i1="i32", stride_ot="i32",
                      stride_oh="i32")
    dense = dict(D=512, A_DIM=512, CHUNK=128, NCH=4, FP8=False, TWO_SOURCES=False)
    model1 = dict(D=512, A_DIM=448, CHUNK=128, NCH=4, FP8=True, TWO_SOURCES=True)
    tiny = dict(D=64, A_DIM=64, CHUNK=64, NCH=1, FP8=False, TWO_SOURCES=False)
    # (name, geometry, kv type, operand type, tile, heads, split tiles, warps, stages, archs):
    # the wrappers' defaults (see sparse_attention._plan) for the H200 and for SM120
    cases = (("dense-bf16-h64-patch", dense, PBF, tl.bfloat16, 64, 64, 1, 8, 2, (90,)),
             ("dense-bf16-h64-exact", dense, PBF, tl.bfloat16, 32, 64, 0, 8, 3, (90,)),
             ("dense-bf16-h32-patch-s3", dense, PBF, tl.bfloat16, 64, 32, 1, 8, 3, (90,)),
             ("dense-bf16-h8-patch", dense, PBF, tl.bfloat16, 64, 16, 1, 4, 3, (90,)),
             ("dense-bf16-h8-exact", dense, PBF, tl.bfloat16, 64, 16, 0, 4, 3, (90,)),
             ("model1-h64-patch", model1, PU8, tl.bfloat16, 64, 64, 1, 8, 2, (90,)),
             ("model1-h64-exact", model1, PU8, tl.bfloat16, 32, 64, 0, 8, 3, (90,)),
             ("model1-h8-patch", model1, PU8, tl.bfloat16, 64, 16, 1, 4, 3, (90,)),
             ("dense-fp32-h16-exact", dense, P32, tl.float32, 32, 16, 0, 4, 1, (90, 120)),
             ("sm120-dense-h8-patch", dense, PBF, tl.bfloat16, 32, 16, 2, 4, 2, (120,)),
             ("sm120-model1-h8-patch", model1, PU8, tl.bfloat16, 32, 16, 2, 4, 1, (120,)),
             ("sm120-model1-h32-exact", model1, PU8, tl.bfloat16, 32, 32, 0, 8, 1, (120,)),
             ("tiny-fp32", tiny, P32, tl.float32, 64, 16, 1, 4, 2, (90, 120)))
    for name, geo, kv, op, tile, bh, st, nw, ns, archs in cases:
        out.append((f"split_partials[{name}]", sa.split_partials,
                    {**split_args, "kv0_ptr": kv},
                    dict(geo, TILE_N=tile, BLOCK_H=bh, SPLIT_TILES=st, OP_DTYPE=op,
                         ROUND_OPS=False, ROUND_PARTIAL=st > 0, NO_RESCALE=False, FINAL=False),
                    dict(num_warps=nw, num_stages=ns), archs))
    attn_args = dict(q_ptr=PBF, kv_ptr=PBF, idx_ptr=PI32, o_ptr=PBF, lse_ptr=P32, lsum_ptr=P32,
                     H="i32", K="i32", S_total="i32", s_offset="i32", scale="fp32",
                     stride_qt="i32", stride_qh="i32", stride_kv="i32", stride_it="i32")
    for name, a_dim, kv, fp8 in (("dense", 512, PBF, False), ("model1", 448, PU8, True)):
        out.append((f"baseline_partial[{name}]", sa.baseline_partial, {**attn_args, "kv_ptr": kv},
                    dict(D=512, A_DIM=a_dim, BLOCK_A=512, BLOCK_B=64 if fp8 else 16,
                         HAS_B=fp8, FP8=fp8, PAGE=64 if fp8 else 1,
                         PAGE_BYTES=37440 if fp8 else 0, BLOCK_T=16, ROUND_PARTIAL=True),
                    dict(num_warps=8, num_stages=1)))
    for nr in (False, True):
        out.append((f"merge_partials[{nr}]", sa.merge_partials,
                    dict(o_ptr=P32, lse_ptr=P32, lsum_ptr=P32, sink_ptr=P32, out_ptr=P32,
                         H="i32", D="i32", S="i32", stride_ot="i32", stride_oh="i32"),
                    dict(NO_RESCALE=nr, ROUND_OUT=True, BLOCK_S=32, BLOCK_D=128)))
    for op, bf in ((tl.bfloat16, True), (tl.float32, False)):
        out.append((f"indexer[{op}]", ix.logits,
                    dict(q_ptr=PBF if bf else P32, w_ptr=P32, k_ptr=PBF if bf else P32,
                         nvis_ptr=PI32, out_ptr=P32, T="i32", H="i32", d="i32", S="i32",
                         stride_qt="i32", stride_qh="i32", stride_wt="i32", stride_k="i32",
                         stride_ot="i32"),
                    dict(BLOCK_T=64, BLOCK_S=64, BLOCK_D=128, OP_DTYPE=op, BF16_DOTS=bf)))
    for dots, fused, xt in (("bf16", True, PBF), ("bf16x3", False, PBF), ("tf32x3", False, P32)):
        for arch, tile, warps in ((90, 128, 8), (120, 64, 4)):  # mhc_mixes' choice per GPU
            out.append((f"mhc[{dots},sm{arch}]", mh.mixes,
                        dict(x_ptr=xt, fn_ptr=P32, out_ptr=P32, part_ptr=P32, sq_ptr=P32,
                             T="i32", M="i32", KD="i32", K_PER_SPLIT="i32", eps="fp32",
                             stride_xt="i32", stride_fm="i32", stride_ot="i32"),
                        dict(BLOCK_T=tile, BLOCK_M=32, BLOCK_K=tile, DOTS=dots, ROUND_OPS=False,
                             ROUND_OUT=dots == "bf16", FUSED=fused),
                        dict(num_warps=warps, num_stages=3), (arch,)))
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
    for mode, op in (("fp32", tl.bfloat16), ("bf16", tl.float8e4nv)):
        out.append((f"indexer_paged[{mode}]", ixp.paged,
                    dict(q_ptr=PU8, pages_ptr=PU8, w_ptr=P32, lens_ptr=PI32, pt_ptr=PI32,
                         out_ptr=P32, H="i32", max_seq_len="i32", n_pages="i32", PPP="i32",
                         stride_qb="i32", stride_wb="i32", stride_pt="i32", stride_ob="i32"),
                    dict(BLOCK_H=64, OP_DTYPE=op, BF16_DOTS=mode == "bf16"),
                    dict(num_warps=4, num_stages=3)))
    out.append(("nvfp4_linear", fp.linear,
                dict(x_ptr=PBF, codes_ptr=PU8, scales_ptr=PF8, g_ptr=P32, out_ptr=P32, T="i32",
                     N="i32", K="i32", stride_xt="i32", stride_ot="i32", g_stride="i32"),
                dict(BLOCK_T=128, BLOCK_N=64, BLOCK_K=64, OP_DTYPE=tl.bfloat16)))
    return out


SMEM_LIMIT = {90: 232448, 120: 101376}  # bytes per block: H100/H200, RTX PRO 6000 (99 KB)
SASS_COUNTS = {"wgmma": r"\b[HQ]GMMA\b", "mma.sync": r"\b[HQ]MMA\b", "cp.async": r"\bLDGSTS\b",
               "spill ld/st": r"\b(?:LDL|STL)\b"}


def sass_facts(compiled) -> str:
    """Registers, stack frame and instruction counts read off the cubin with the cuobjdump that
    Triton ships: is tl.dot on wgmma (HGMMA/QGMMA) or mma.sync (HMMA), are the key loads
    cp.async (LDGSTS, software-pipelined), does anything spill (LDL/STL)."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        sass = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True).stdout
        res = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True,
                             text=True).stdout
    regs = re.search(r"REG:(\d+)", res)
    stack = re.search(r"STACK:(\d+)", res)
    counts = " ".join(f"{k} {len(re.findall(v, sass))}" for k, v in SASS_COUNTS.items())
    return (f"regs {regs.group(1) if regs else '?'} stack {stack.group(1) if stack else '?'} "
            f"{counts}")


ALIGNED_INTS = {"kv1_off", "idx1_off", "pby0", "pby1",  # multiples of 16 at every launch
                "KD", "K_PER_SPLIT", "K0", "K1", "max_seq_len"}  # ... at the Flash shapes


def aligned(kernel, sig: dict) -> dict:
    """What a launch specialises: pointers (torch allocations) and strides divisible by 16
    (the wrappers' tensors are; without it loads are not vectorised nor cp.async-pipelined)."""
    names = kernel.arg_names
    return {(names.index(k),): [["tt.divisibility", 16]] for k, v in sig.items()
            if v.startswith("*") or k.startswith("stride") or k in ALIGNED_INTS}


def compile_all(archs: list[int], only: str = "", facts: bool = False) -> list[str]:
    failures = []
    for arch in archs:
        target = GPUTarget("cuda", arch, 32)
        for name, kernel, sig, consts, *rest in specs():
            options = rest[0] if rest else dict(num_warps=4, num_stages=2)
            if only not in name or (len(rest) > 1 and arch not in rest[1]):
                continue
            signature = {**sig, **{k: "constexpr" for k in consts}}
            try:
                c = triton.compile(ASTSource(kernel, signature, constexprs=consts,
                                             attrs=aligned(kernel, sig)),
                                   target=target, options=options)
            except Exception as e:  # noqa: BLE001 - report every failing kernel
                failures.append(f"sm_{arch} {name}: {type(e).__name__}: {str(e)[:400]}")
                continue
            if c.metadata.shared > SMEM_LIMIT[arch]:
                failures.append(f"sm_{arch} {name}: {c.metadata.shared} B of shared memory")
            extra = f"; {sass_facts(c)}" if facts else ""
            print(f"sm_{arch} {name} w{options['num_warps']} s{options['num_stages']}: shared "
                  f"{c.metadata.shared} B{extra}", flush=True)
    return failures


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("archs", nargs="*", type=int, default=[90])
    ap.add_argument("--only", default="", help="compile the kernels whose name contains this")
    ap.add_argument("--facts", action="store_true", help="registers, spills, MMA kind (SASS)")
    args = ap.parse_args()
    fails = compile_all(args.archs, args.only, args.facts)
    print("\n".join(fails) if fails else "ok")
    sys.exit(1 if fails else 0)
