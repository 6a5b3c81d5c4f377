"""Relative error of the wo_a GEMM output under each fp8-wo-a-gemm mode and fault, shipped
checkpoint at `precision: deployment`, one 300-token prefill of random token ids (seed 0):

    PYTHONPATH=. python tests/benchmarks/wo_a_fault_size.py
"""
import torch
from dsv4bisect.reference import model as M
from dsv4bisect.reference.engine import ReferenceEngine

eng = ReferenceEngine.load(None, patches={"fp8-wo-a-gemm": "fp8"}, device="cpu", precision="deployment")
tf = eng.model
rec = []
orig = M.wo_a_input
def spy(o, mode):
    rec.append(o.clone())
    return orig(o, mode)
M.wo_a_input = spy
toks = torch.randint(2, tf.a.vocab_size, (300,), generator=torch.Generator().manual_seed(0))
with torch.inference_mode():
    tf.forward(toks)
M.wo_a_input = orig
layers = list(tf.layers)
for mode in ("bf16", "fp8", "scale-layout", "scale-truncate"):
    errs = []
    for o, blk in zip(rec, layers):
        w = blk.attn.wo_a.value().view(tf.a.o_groups, tf.a.o_lora_rank, -1)
        ref = torch.einsum("tgd,grd->tgr", o, w)
        got = torch.einsum("tgd,grd->tgr", orig(o, mode), w)
        errs.append(((got - ref).norm() / ref.norm()).item())
    print(f"{mode:15s} wo_a output rel L2 error per layer vs fp32 input: " + " ".join(f"{e:.3g}" for e in errs))
o = rec[2]
print("T, G, C of a prefill forward:", tuple(o.shape))
