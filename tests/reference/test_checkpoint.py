"""Checkpoint I/O: sharded save + lazy load round trip, clear errors, DeepSeek's FP8/FP4 storage
formats, and a real DeepSeek-V4-Flash layer loaded from a directory slice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dsv4bisect.errors import ConfigError
from dsv4bisect.reference.checkpoint import (
    INDEX_NAME,
    CheckpointReader,
    init_module,
    load_layer,
    load_model,
    save_checkpoint,
    state_tensors,
    to_deepseek_fp4,
    to_deepseek_fp8,
)
from dsv4bisect.reference.config import ModelArgs, Numerics
from dsv4bisect.reference.model import build_block

TINY = ModelArgs.preset("tiny")


@pytest.fixture(scope="module")
def ckpt(model, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    save_checkpoint(out, TINY, state_tensors(model), max_shard_bytes=1 << 20)
    return out


def logits_of(m, ids: torch.Tensor) -> torch.Tensor:
    m.configure(Numerics())
    return m(ids)


def copy_ckpt(src: Path, dst: Path, edit) -> Path:
    """A one-shard copy of `src` with `edit(tensors, config)` applied."""
    tensors = {}
    with CheckpointReader(src) as r:
        for name in r.names():
            tensors[name] = r.get(name)
    config = json.loads((src / "config.json").read_text())
    edit(tensors, config)
    dst.mkdir()
    (dst / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def test_sharded_round_trip_gives_identical_logits(model, ckpt: Path) -> None:
    shards = sorted(ckpt.glob("model-*.safetensors"))
    assert len(shards) > 1
    index = json.loads((ckpt / INDEX_NAME).read_text())
    assert set(index["weight_map"]) == set(model.state_dict())
    assert set(index["weight_map"].values()) == {s.name for s in shards}
    ids = torch.randint(2, 512, (120,), generator=torch.Generator().manual_seed(0))
    assert torch.equal(logits_of(load_model(ckpt), ids), logits_of(model, ids))


def test_names_are_deepseek_checkpoint_names(ckpt: Path) -> None:
    names = set(CheckpointReader(ckpt).names())
    for name in (
        "embed.weight",
        "head.weight",
        "norm.weight",
        "hc_head_fn",
        "hc_head_base",
        "hc_head_scale",
        "layers.0.attn_norm.weight",
        "layers.0.hc_attn_fn",
        "layers.0.hc_ffn_scale",
        "layers.0.attn.attn_sink",
        "layers.0.attn.wq_a.weight",
        "layers.0.attn.wo_b.weight",
        "layers.2.attn.compressor.ape",
        "layers.2.attn.compressor.wgate.weight",
        "layers.2.attn.indexer.wq_b.weight",
        "layers.2.attn.indexer.weights_proj.weight",
        "layers.2.attn.indexer.compressor.norm.weight",
        "layers.3.attn.compressor.wkv.weight",
        "layers.0.ffn.gate.tid2eid",
        "layers.3.ffn.gate.bias",
        "layers.5.ffn.experts.15.w3.weight",
        "layers.5.ffn.shared_experts.w2.weight",
        "mtp.0.e_proj.weight",
        "mtp.0.hnorm.weight",
        "mtp.0.hc_head_fn",
        "mtp.0.attn.wkv.weight",
    ):
        assert name in names, name
    assert "layers.3.attn.indexer.wq_b.weight" not in names  # HCA layers have no indexer
    assert "layers.3.ffn.gate.tid2eid" not in names and "layers.0.ffn.gate.bias" not in names


def test_reader_reads_one_tensor_from_its_shard(model, ckpt: Path) -> None:
    reader = CheckpointReader(ckpt)
    name = "layers.5.ffn.experts.3.w2.weight"
    assert reader.shape(name) == (256, 64)
    assert torch.equal(reader.get(name), model.state_dict()[name])
    assert reader.get("layers.0.ffn.gate.tid2eid").dtype == torch.int64


def test_a_single_safetensors_file_loads(model, ckpt: Path, tmp_path: Path) -> None:
    single = copy_ckpt(ckpt, tmp_path / "single", lambda t, c: None)
    assert not (single / INDEX_NAME).exists()
    ids = torch.randint(2, 512, (40,), generator=torch.Generator().manual_seed(1))
    assert torch.equal(logits_of(load_model(single), ids), logits_of(model, ids))


def test_unknown_tensor_is_named(ckpt: Path, tmp_path: Path) -> None:
    bad = copy_ckpt(
        ckpt, tmp_path / "b", lambda t, c: t.update({"layers.1.attn.bogus": torch.ones(3)})
    )
    with pytest.raises(ConfigError, match=r"does not: layers\.1\.attn\.bogus") as err:
        load_model(bad)
    assert err.value.hint


def test_missing_tensor_is_named(ckpt: Path, tmp_path: Path) -> None:
    bad = copy_ckpt(ckpt, tmp_path / "m", lambda t, c: t.pop("layers.3.attn.compressor.ape"))
    with pytest.raises(ConfigError, match=r"lacks 1 tensor.*layers\.3\.attn\.compressor\.ape"):
        load_model(bad)


def test_wrong_shape_is_named(ckpt: Path, tmp_path: Path) -> None:
    bad = copy_ckpt(
        ckpt, tmp_path / "s", lambda t, c: t.update({"layers.2.attn.attn_sink": torch.zeros(5)})
    )
    with pytest.raises(ConfigError, match=r"layers\.2\.attn\.attn_sink.*\(5,\).*\(4,\)"):
        load_model(bad)


def test_config_that_disagrees_with_the_shards(ckpt: Path, tmp_path: Path) -> None:
    """num_hash_layers 2 but layer 2 ships tid2eid: named as unknown, bias as missing."""
    bad = copy_ckpt(ckpt, tmp_path / "c", lambda t, c: c.update({"num_hash_layers": 2}))
    with pytest.raises(ConfigError, match=r"layers\.2\.ffn\.gate\.bias"):
        load_model(bad)
    (tmp_path / "c" / "config.json").write_text("{ nope")
    with pytest.raises(ConfigError, match=r"config\.json:1:3: not valid JSON"):
        load_model(bad)
    with pytest.raises(ConfigError, match="no config.json"):
        load_model(tmp_path)


def test_deepseek_fp8_and_fp4_formats_dequantize(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(300, 200, generator=g)
    w8, s8 = to_deepseek_fp8(w)
    assert w8.dtype == torch.float8_e4m3fn and s8.shape == (3, 2)
    e = torch.randn(64, 96, generator=g)
    e4, s4 = to_deepseek_fp4(e)
    assert e4.dtype == torch.int8 and e4.shape == (64, 48) and s4.shape == (64, 3)
    raw = {
        "a.weight": w8,
        "a.scale": s8,
        "e.weight": e4,
        "e.scale": s4.view(torch.uint8),
        "bf.weight": w.to(torch.bfloat16),
    }
    save_file(raw, str(tmp_path / "x.safetensors"))
    r = CheckpointReader(tmp_path / "x.safetensors")
    a = r.get_weight("a.weight")
    assert ((a - w).norm() / w.norm()) < 0.04  # E4M3: 3 mantissa bits
    exact = (
        w8.float() * s8.float().repeat_interleave(128, 0)[:300].repeat_interleave(128, 1)[:, :200]
    )
    assert torch.equal(a, exact)
    deq = r.get_weight("e.weight")  # raw uint8 exponents decode like float8_e8m0fnu
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    v = deq / s4.float().repeat_interleave(32, 1)
    assert torch.isin(v.abs(), grid).all()
    assert ((deq - e).norm() / e.norm()) < 0.2
    assert r.get_weight("bf.weight").dtype == torch.float32


def test_one_layer_with_some_experts_loads_from_a_full_checkpoint(model, ckpt: Path) -> None:
    block = load_layer(ckpt, 3, expert_ids=[2, 9])
    want = state_tensors(model)
    got = state_tensors(block, prefix="layers.3.")
    assert (
        "layers.3.ffn.experts.9.w2.weight" in got and "layers.3.ffn.experts.0.w2.weight" not in got
    )
    assert all(torch.equal(t, want[name]) for name, t in got.items())


@pytest.mark.slow
def test_flash_layer_loads_from_a_directory_slice(tmp_path: Path) -> None:
    """Layer 4 of DeepSeek-V4-Flash (CSA + indexer, score-routed MoE) stored as DeepSeek ships it:
    FP8 dense projections with block scales, bf16 compressor/indexer, MXFP4 experts; the slice
    holds one expert only."""
    f = ModelArgs.preset("flash")
    src = build_block(f, 4, expert_ids=[7])
    init_module(src, f, seed=1, prefix="layers.4.")
    stored: dict[str, torch.Tensor] = {}
    for name, t in state_tensors(src, prefix="layers.4.").items():
        base = name[: -len(".weight")]
        if (
            name.endswith(
                ("wq_a.weight", "wq_b.weight", "wkv.weight", "wo_a.weight", "wo_b.weight")
            )
            and ".compressor." not in name
        ):
            stored[name], stored[base + ".scale"] = to_deepseek_fp8(t)
        elif ".experts." in name:
            stored[name], stored[base + ".scale"] = to_deepseek_fp4(t)
        elif "compressor.w" in name or "weights_proj" in name:
            stored[name] = t.to(torch.bfloat16)
        else:
            stored[name] = t
    save_checkpoint(tmp_path, f, stored, max_shard_bytes=64 << 20)
    block = load_layer(tmp_path, 4, expert_ids=[7])
    reader = CheckpointReader(tmp_path)
    got = block.state_dict()
    for name in (
        "attn.wq_b.weight",
        "attn.indexer.compressor.wkv.weight",
        "ffn.experts.7.w1.weight",
        "hc_ffn_fn",
        "attn.compressor.ape",
    ):
        assert torch.equal(got[name], reader.get_weight("layers.4." + name)), name
    want = src.state_dict()["attn.wo_a.weight"]
    assert ((got["attn.wo_a.weight"] - want).norm() / want.norm()) < 0.04
    assert torch.equal(got["ffn.gate.bias"], src.state_dict()["ffn.gate.bias"])
    with pytest.raises(ConfigError, match=r"lacks 3 .*layers\.4\.ffn\.experts\.1\.w1\.weight"):
        load_layer(tmp_path, 4, expert_ids=[1, 7])  # expert 1 is not in the slice
    with pytest.raises(ConfigError, match="out of range"):
        load_layer(tmp_path, 43)
