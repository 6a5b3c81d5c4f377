"""GPU paths: `--device cuda` runs the patched ops with the Triton kernels (mhc_mixes,
sparse_attention split-K, indexer_logits, NVFP4 quantiser).

Run on a CUDA machine (the H200; under a minute):
    MICROTEST_GPU_OUT=$OUT python -m pytest tests/microtest -m gpu -q -rs
`MICROTEST_GPU_OUT` (optional) receives microtest.md / .json of the Flash-size run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dsv4bisect.microtest.run import run_microtest, write_report
from dsv4bisect.microtest.spec import MicrotestSpec, parse_patches

from .conftest import write_flash_slice

pytestmark = pytest.mark.gpu


def run(checkpoint: str, device: str, **kw: object):
    return run_microtest(MicrotestSpec(patches=parse_patches([]), checkpoint=checkpoint,
                                       device=device, **kw))


def test_cuda_agrees_with_cpu_on_the_random_model() -> None:
    kw = {"layers": "2,3", "contexts": (1024, 32768), "tokens": 32}
    cpu, gpu = run("random", "cpu", **kw), run("random", "cuda", **kw)
    assert [(r.patch, r.layers, r.case) for r in cpu.rows] == \
        [(r.patch, r.layers, r.case) for r in gpu.rows]
    for c, g in zip(cpu.rows, gpu.rows, strict=True):
        if c.patch == "triton-indexer":  # flips of near-ties may differ between kernels
            assert abs(c.value - g.value) < 0.02, c.case
        elif c.metric == "rel_err" and c.value >= 1e-4:
            assert c.value / 3 < g.value < c.value * 3, (c.patch, c.layers, c.case)
        elif c.metric == "factor_dev":
            assert g.value == c.value
        if c.patch != "triton-indexer":
            assert g.status == c.status, (c.patch, c.layers, c.case)


def test_flash_size_layers_at_128k_on_cuda(tmp_path: Path) -> None:
    ckpt = tmp_path / "flash-slice"
    write_flash_slice(ckpt, layers=(2, 3), experts=(0, 255))
    rep = run(str(ckpt), "cuda", layers="2,3", contexts=(8192, 131072), tokens=32)
    write_report(rep, Path(os.environ.get("MICROTEST_GPU_OUT", tmp_path / "out")))
    by = {(r.patch, r.layers, r.case): r for r in rep.rows}
    assert all(r.status == "ok" for r in rep.rows if r.patch == "mhc-bf16")
    hca = by["mma-decode", (3,), "ctx 131072: bf16 partials"]
    assert hca.detail["splits"] == 18 and hca.status == "ok"
    assert len([r for r in rep.rows if r.patch == "triton-indexer"]) == 2
    assert by["trtllm-clamp", (2,), "alpha: clamp at limit / alpha"].status == "ok"
    marlin = [r for r in rep.rows if r.patch == "hash-topk-scaling" and "marlin" in r.case]
    assert marlin and all(r.status == "FAIL" for r in marlin)
    assert rep.seconds < 50
