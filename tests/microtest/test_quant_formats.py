"""The stored formats against independent decoders: the bit layouts of the format specs (OCP
FP8 E4M3, OCP MX E2M1 and E8M0) written here from the specs, known vectors, and ml_dtypes'
implementation where it is installed; and the synthetic checkpoint read back through the reader."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4bisect.errors import ConfigError
from dsv4bisect.reference.checkpoint import CheckpointReader, load_layer
from dsv4bisect.reference.quant_formats import (
    classify,
    dequantize,
    encode,
    quantize_fp8_block,
    ue8m0_values,
    unpack_e2m1,
)

from .conftest import NVFP4_LAYERS, stored_format_for


# ---- independent decoders, from the specs' bit layouts ------------------------------------------
def e4m3_spec(b: int) -> float:
    """OCP FP8 E4M3 ("fn"): 1 sign, 4 exponent (bias 7), 3 mantissa bits; S.1111.111 is NaN."""
    s, e, m = b >> 7, (b >> 3) & 0xF, b & 0x7
    if e == 15 and m == 7:
        return math.nan
    v = (m / 8) * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -v if s else v


def e2m1_spec(c: int) -> float:
    """OCP MX FP4 E2M1: 1 sign, 2 exponent (bias 1), 1 mantissa bit."""
    s, e, m = c >> 3, (c >> 1) & 0x3, c & 0x1
    v = m * 0.5 if e == 0 else (1 + m / 2) * 2.0 ** (e - 1)
    return -v if s else v


def ue8m0_spec(b: int) -> float:
    return math.nan if b == 255 else 2.0 ** (b - 127)


E4M3 = np.array([e4m3_spec(b) for b in range(256)])
E2M1 = np.array([e2m1_spec(c) for c in range(16)])
UE8M0 = np.array([ue8m0_spec(b) for b in range(256)])


def decode_independent(fmt: str, t: dict[str, np.ndarray]) -> np.ndarray:
    """Dequantise with the spec tables and numpy only (no code shared with the package)."""
    w = t["weight"]
    if fmt == "fp8-block":
        s = UE8M0[t["scale"]] if t["scale"].dtype == np.uint8 else t["scale"]
        vals = E4M3[w]
        full = np.repeat(np.repeat(s, 128, 0), 128, 1)[: vals.shape[0], : vals.shape[1]]
        return vals * full
    lo, hi = E2M1[w & 0x0F], E2M1[w >> 4]
    vals = np.stack([lo, hi], -1).reshape(w.shape[0], -1)  # element 2i = low nibble
    if fmt == "mxfp4":
        s = np.repeat(UE8M0[t["scale"]], 32, 1)
        return vals * s
    s = np.repeat(E4M3[t["weight_scale"]], 16, 1) * float(t["weight_scale_2"])
    return vals * s


def assert_decoded(fmt: str, got: torch.Tensor, arrays: dict[str, np.ndarray]) -> None:
    """Exact, except NVFP4: its three-factor product (E2M1 · E4M3 · fp32 global) may round
    once more in fp32 than the fp64 independent decoder (≤ 2 ulp)."""
    want = decode_independent(fmt, arrays)
    if fmt == "nvfp4":
        np.testing.assert_allclose(got.double().numpy(), want, rtol=2.5e-7, atol=0)
    else:
        np.testing.assert_array_equal(got.double().numpy(), want.astype(np.float32))


def as_bytes(x: torch.Tensor) -> np.ndarray:
    if x.dtype in (torch.float32, torch.float64):
        return x.double().numpy()
    return x.contiguous().view(torch.uint8).numpy()


# ---- known vectors and code tables ---------------------------------------------------------------
def test_known_vectors_from_the_specs() -> None:
    assert [e4m3_spec(b) for b in (0x00, 0x01, 0x07, 0x08, 0x38, 0x7E, 0xFE)] == \
        [0.0, 2.0**-9, 7 * 2.0**-9, 2.0**-6, 1.0, 448.0, -448.0]
    assert math.isnan(e4m3_spec(0x7F)) and math.isnan(e4m3_spec(0xFF))
    assert list(E2M1[:8]) == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert list(E2M1[8:]) == [-0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    assert (ue8m0_spec(127), ue8m0_spec(128), ue8m0_spec(0)) == (1.0, 2.0, 2.0**-127)


def test_package_decoders_match_the_spec_tables() -> None:
    b = torch.arange(256, dtype=torch.uint8)
    np.testing.assert_array_equal(b.view(torch.float8_e4m3fn).float().double().numpy(),
                                  E4M3.astype(np.float32).astype(np.float64))
    np.testing.assert_array_equal(ue8m0_values(b).double().numpy(),
                                  UE8M0.astype(np.float32).astype(np.float64))
    packed = torch.tensor([[0x21, 0xF8, 0x7E]], dtype=torch.uint8)  # (lo, hi) nibble pairs
    assert unpack_e2m1(packed).tolist() == [[0.5, 1.0, -0.0, -6.0, -4.0, 6.0]]


def test_spec_tables_match_ml_dtypes() -> None:
    mld = pytest.importorskip("ml_dtypes")
    b = np.arange(256, dtype=np.uint8)
    np.testing.assert_array_equal(b.view(mld.float8_e4m3fn).astype(np.float64), E4M3)
    np.testing.assert_array_equal(b.view(mld.float8_e8m0fnu).astype(np.float64), UE8M0)
    codes = np.arange(16, dtype=np.uint8).view(mld.float4_e2m1fn)  # one code per byte
    np.testing.assert_array_equal(codes.astype(np.float64), E2M1)


# ---- encoders + the package decoder vs originals and the independent decoder ---------------------
@pytest.mark.parametrize("fmt,bound", [("fp8-block", 0.04), ("fp8-block-fp32", 0.04),
                                       ("fp8-tensor", 0.05), ("mxfp4", 0.2), ("nvfp4", 0.12)])
def test_round_trip_and_independent_decode(fmt: str, bound: float) -> None:
    w = torch.randn(300, 256, generator=torch.Generator().manual_seed(1))
    stored = encode("m.weight", w, fmt)
    side = {k.split(".", 1)[1]: v for k, v in stored.items() if k != "m.weight"}
    got_fmt = classify("m.weight", stored["m.weight"].dtype, tuple(stored["m.weight"].shape),
                       {r: (t.dtype, tuple(t.shape)) for r, t in side.items()})
    assert got_fmt == fmt.removesuffix("-fp32")
    deq = dequantize("m.weight", got_fmt, stored["m.weight"], side)
    assert float((deq - w).norm() / w.norm()) < bound
    if got_fmt != "fp8-tensor":
        arrays = {"weight": as_bytes(stored["m.weight"])}
        arrays.update({r: as_bytes(t) for r, t in side.items()})
        if "weight_scale_inv" in arrays:
            arrays["scale"] = arrays.pop("weight_scale_inv")
        assert_decoded(got_fmt, deq, arrays)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 300), cols=st.integers(1, 300), log_scale=st.floats(-20, 20),
       seed=st.integers(0, 2**16), ue8m0=st.booleans())
def test_fp8_block_error_is_bounded_per_element(rows: int, cols: int, log_scale: float,
                                                seed: int, ue8m0: bool) -> None:
    """E4M3 keeps 3 mantissa bits: |deq − w| ≤ 2⁻⁴·|w| + half the subnormal step (2⁻¹⁰) × the
    block scale, for any shape (partial blocks too) and magnitude."""
    w = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 2.0**log_scale
    q, s = quantize_fp8_block(w, "ue8m0" if ue8m0 else "fp32")
    deq = dequantize("w.weight", "fp8-block", q, {"scale": s})
    full = ue8m0_values(s).repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)[:, :cols]
    assert bool(((deq - w).abs() <= w.abs() * 2.0**-4 + full * 2.0**-10 * 1.0001).all())


def test_bad_format_combinations_are_named() -> None:
    fp4 = (torch.uint8, (8, 16))
    with pytest.raises(ConfigError, match=r"x\.weight_scale_2"):
        classify("x.weight", *fp4, {"weight_scale": (torch.float8_e4m3fn, (8, 2))})
    with pytest.raises(ConfigError, match="no scale"):
        classify("x.weight", torch.float8_e4m3fn, (8, 16), {})
    with pytest.raises(ConfigError, match=r"shape \(3, 3\)"):
        classify("x.weight", torch.float8_e4m3fn, (200, 200), {"scale": (torch.uint8, (3, 3))})
    with pytest.raises(ConfigError, match="groups of 32"):
        classify("x.weight", *fp4, {"scale": (torch.uint8, (8, 2))})


# ---- the synthetic checkpoint directory, read back -----------------------------------------------
def test_synthetic_checkpoint_reads_back(synthetic: tuple[Path, dict[str, torch.Tensor]]) -> None:
    directory, originals = synthetic
    assert (directory / "model.safetensors.index.json").is_file()
    assert len(list(directory.glob("*.safetensors"))) > 1  # sharded
    bounds = {"fp8-block": 0.04, "mxfp4": 0.2, "nvfp4": 0.12, "bf16": 0.01}
    seen: set[str] = set()
    with CheckpointReader(directory) as r:
        for name, want in originals.items():
            fmt = r.stored_format(name)
            seen.add(fmt)
            got = r.get_weight(name)
            if fmt in ("fp32", "int"):
                assert torch.equal(got, want.to(got.dtype)), name
                continue
            assert float((got - want).norm() / want.norm()) < bounds[fmt], name
            if fmt in ("fp8-block", "mxfp4", "nvfp4"):
                base = name[: -len(".weight")]
                arrays = {"weight": as_bytes(r.get(name))}
                for role in ("scale", "weight_scale_inv", "weight_scale", "weight_scale_2"):
                    if f"{base}.{role}" in r:
                        arrays["scale" if role == "weight_scale_inv" else role] = \
                            as_bytes(r.get(f"{base}.{role}"))
                assert_decoded(fmt, got, arrays)
    assert seen >= {"fp8-block", "mxfp4", "nvfp4", "bf16", "fp32", "int"}
    assert stored_format_for("layers.3.ffn.experts.0.w1.weight") == "nvfp4"


def test_layers_with_nvfp4_sidecars_load_strictly(synthetic: tuple[Path, dict]) -> None:
    """`load_layer` (strict about unknown tensors) accepts the ModelOpt sidecars."""
    directory, originals = synthetic
    block = load_layer(directory, NVFP4_LAYERS[0])
    got = block.state_dict()["ffn.experts.2.w3.weight"]
    want = originals[f"layers.{NVFP4_LAYERS[0]}.ffn.experts.2.w3.weight"]
    assert float((got - want).norm() / want.norm()) < 0.12
