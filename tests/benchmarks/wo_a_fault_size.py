"""Relative error of the wo_a GEMM output under each fp8-wo-a-gemm mode and fault, shipped
checkpoint at `precision: deployment`, one 300-token prefill of random token ids (seed 0):

    PYTHONPATH=. python tests/benchmarks/wo_a_fault_size.py
"""
import torch

from dsv4bisect.patches import fp8_wo_a_gemm as patch
from dsv4bisect.reference.engine import ReferenceEngine

eng = ReferenceEngine.load(None, patches={"fp8-wo-a-gemm": "fp8"}, device="cpu", precision="deployment")
tf = eng.model
rec = []
# the attention output as it enters each layer's wo_a_input place (the bf16 rounding and the FP8
# read are that place's implementation: the patch's swap)
hooks = [blk.attn.wo_a_input.register_forward_pre_hook(lambda m, args: rec.append(args[0].clone()))
         for blk in tf.layers]
toks = torch.randint(2, tf.a.vocab_size, (300,), generator=torch.Generator().manual_seed(0))
with torch.inference_mode():
    tf.forward(toks)
for h in hooks:
    h.remove()
READS = {"bf16": lambda o: o, "fp8": patch.fp8, "scale-layout": patch.scale_layout,
         "scale-truncate": patch.scale_truncate}
layers = list(tf.layers)
for mode in ("bf16", "fp8", "scale-layout", "scale-truncate"):
    errs = []
    for o, blk in zip(rec, layers):
        w = blk.attn.wo_a.value().view(tf.a.o_groups, tf.a.o_lora_rank, -1)
        ref = torch.einsum("tgd,grd->tgr", o, w)
        got = torch.einsum("tgd,grd->tgr", READS[mode](o.bfloat16().float()), w)
        errs.append(((got - ref).norm() / ref.norm()).item())
    print(f"{mode:15s} wo_a output rel L2 error per layer vs fp32 input: " + " ".join(f"{e:.3g}" for e in errs))
o = rec[2]
print("T, G, C of a prefill forward:", tuple(o.shape))
