"""The MTP layer beside the shipped checkpoint: the main model unchanged, the file loads only
when asked, in the deployment's formats, and drafts the probe's answers; the MTP-only training
mode leaves the main weights bit for bit as they were."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from dsv4bisect.config.checkpoints import EMBEDDED_CHECKPOINT
from dsv4bisect.config.fingerprint import model_identity
from dsv4bisect.errors import ConfigError
from dsv4bisect.reference.checkpoint import load_model, random_model, save_checkpoint, state_tensors
from dsv4bisect.reference.config import Numerics
from dsv4bisect.reference.mtp import MTP_CONFIG_NAME, MTP_WEIGHTS_NAME, has_mtp_file
from dsv4bisect.reference.training import data, mtp, train
from dsv4bisect.reference.training.eval import probe_acceptance, probe_cases
from dsv4bisect.reference.training.ops import training_ops

# The main checkpoint's files as shipped before the MTP layer was added (issue 19's export):
# adding the MTP layer must not change a byte of them, nor the model fingerprint taken of them.
MAIN_SHA256 = {
    "config.json": "4ae7c3ff9031f8b15b33e248b78ace015d68be8b8cf548dc6e8be87e1ad81c52",
    "hf_quant_config.json": "03b01661ec0cfb0cb67640940f0e45af8c4f7f9101edad5885e58dfcba128701",
    "model-00001-of-00001.safetensors": "205dfcae7f03783d4765d40fbd1dfd7a3a177a3907589d4b1e98e7f38a1e1a6b",
    "model.safetensors.index.json": "7d05a421458ec2ec470a96787b64fdc7b3e895d557be820edff21226c9126f00",
}
MODEL_IDENTITY = "573378cb30eb4b25"
TOKENS = [0, 4, 60, 71, 72, 73, 32, 61, 62, 63, 10, 99, 100, 101, 102, 103] * 8


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_main_checkpoint_files_and_fingerprint_are_as_shipped() -> None:
    assert has_mtp_file(EMBEDDED_CHECKPOINT)
    assert {n: _sha(EMBEDDED_CHECKPOINT / n) for n in MAIN_SHA256} == MAIN_SHA256
    assert model_identity(str(EMBEDDED_CHECKPOINT)) == {"model": MODEL_IDENTITY}


def test_loading_the_mtp_layer_leaves_the_main_logits_bit_for_bit() -> None:
    plain, with_mtp = load_model(EMBEDDED_CHECKPOINT), load_model(EMBEDDED_CHECKPOINT, mtp=True)
    assert plain.a.num_nextn_predict_layers == 0 and len(plain.mtp) == 0
    assert with_mtp.a.num_nextn_predict_layers == 1 and len(with_mtp.mtp) == 1
    x = torch.tensor(TOKENS)
    for precision in ("exact", "deployment"):  # configure() rebuilds all derived values
        for m in (plain, with_mtp):
            m.configure(Numerics(precision=precision))
        with torch.no_grad():
            assert torch.equal(plain(x), with_mtp(x)), precision
    main = {k: v for k, v in with_mtp.state_dict().items() if not k.startswith("mtp.")}
    assert all(torch.equal(v, plain.state_dict()[k]) for k, v in main.items())


def test_the_mtp_file_is_stored_as_the_deployment_stores_mtp() -> None:
    model = load_model(EMBEDDED_CHECKPOINT, mtp=True)
    fmts = {k: v for k, v in model.stored_formats.items() if k.startswith("mtp.")}
    gemm = [k for k in fmts if any(s in k for s in ("e_proj", "h_proj", ".attn.wq_a", ".attn.wkv",
                                                    ".attn.wo_b", "shared_experts", ".experts."))]
    assert gemm and all(fmts[k] == "fp8-block" for k in gemm)
    assert fmts["mtp.0.enorm.weight"] == fmts["mtp.0.ffn.gate.weight"] == "bf16"
    cfg = json.loads((EMBEDDED_CHECKPOINT / MTP_CONFIG_NAME).read_text())
    assert cfg["num_nextn_predict_layers"] == 1 and cfg["compress_ratios"] == [0]


def test_the_mtp_layer_drafts_the_probes_answers() -> None:
    """Greedy draft acceptance on a small CPU sample of the probe's needle and copy answers
    (the smoke tier's cells at 512 tokens; docs/training.md has the full figures)."""
    model = load_model(EMBEDDED_CHECKPOINT, mtp=True)
    model.configure(Numerics(precision="exact"))
    result = probe_acceptance(model, probe_cases((512,), 1, tiers=("smoke",)))
    assert result["cases"] == 6 and result["drafted"] > 100
    assert result["accept"] >= 0.6, result


def test_a_checkpoint_without_mtp_loads_and_asking_for_mtp_is_a_config_error(tmp_path) -> None:
    for name in ("config.json", "model-00001-of-00001.safetensors",
                 "model.safetensors.index.json", "hf_quant_config.json"):
        shutil.copy(EMBEDDED_CHECKPOINT / name, tmp_path / name)
    assert load_model(tmp_path).a.num_nextn_predict_layers == 0
    with pytest.raises(ConfigError, match="no MTP layer file"):
        load_model(tmp_path, mtp=True)
    (tmp_path / MTP_CONFIG_NAME).write_text('{"num_nextn_predict_layers": 1}')
    shutil.copy(EMBEDDED_CHECKPOINT / MTP_WEIGHTS_NAME, tmp_path / MTP_WEIGHTS_NAME)
    with pytest.raises(ConfigError, match="compress_ratios"):
        load_model(tmp_path, mtp=True)


def _small_main(tmp_path: Path) -> Path:
    args = train.TrainConfig().model_args().with_(num_hidden_layers=2, compress_ratios=(0, 4))
    save_checkpoint(tmp_path / "main", args, state_tensors(random_model(args, 3)))
    return tmp_path / "main"


def test_mtp_training_moves_only_the_mtp_layer_and_resumes(tmp_path) -> None:
    main = _small_main(tmp_path)
    cfg = dataclasses.replace(train.TrainConfig(), mtp_main=str(main), workers=0)
    model = mtp.mtp_model(str(main), 1, torch.device("cpu"))
    model.ops = training_ops()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = train.optimizer(mtp.mtp_trainable(model), cfg)
    tok, w = train.to_tensors(*train.make_batch(1, 0, 96, 128, 256, 2, "codes"),
                              torch.device("cpu"))
    stats, _ = train.optimize(model, opt, cfg, tok, w, 1e-3, False)
    assert stats["answer_ce"] > 0
    after = model.state_dict()
    moved = {k for k in after if not torch.equal(after[k], before[k])}
    assert moved and all(k.startswith("mtp.") for k in moved)
    meta = {"step": 1, "elapsed_s": 1.0, "stage": 0, "stage_start": 0,
            "config": dataclasses.asdict(cfg)}
    train.save(tmp_path / "run", model, opt, meta)
    shards = [torch.load(p, weights_only=True) for p in (tmp_path / "run/state").glob("*.pt")]
    assert all(k.startswith(("model.mtp.", "opt.")) for s in shards for k in s)
    fresh = mtp.mtp_model(str(main), 2, torch.device("cpu"))  # another init seed
    train.load_state(tmp_path / "run/state", fresh, train.optimizer(mtp.mtp_trainable(fresh), cfg),
                     torch.device("cpu"))
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in after.items())
    # the checkpoint it writes is the MTP layer alone, loadable beside its main checkpoint
    for name in (MTP_CONFIG_NAME, MTP_WEIGHTS_NAME):
        shutil.copy(tmp_path / "run/checkpoint" / name, main / name)
    loaded = load_model(main, mtp=True)
    assert loaded.a.num_nextn_predict_layers == 1
    x = tok[0, :64]
    assert torch.equal(loaded(x), load_model(main)(x))  # the main model as it was


def test_drafted_positions_are_answer_tokens_after_the_first() -> None:
    w = torch.tensor([[0.1, 0.1, 1.0, 1.0, 1.0, 0.1, 1.0, 1.0]])
    assert mtp.drafted_mask(w).tolist() == [[False, False, False, True, True, False, False, True]]
    assert data.ANSWER == 1.0


def test_chained_training_starts_from_a_stored_mtp_layer_and_keeps_depth_one(tmp_path) -> None:
    """`mtp_init` starts from the MTP file beside a checkpoint; the chained loss (depths 1..3,
    depth k fed the MTP layer's own depth-(k-1) output of the row before) keeps depth 1 as the
    single-depth objective and trains only the MTP layer."""
    main = _small_main(tmp_path)
    trained = mtp.mtp_model(str(main), 5, torch.device("cpu"))
    train.save(tmp_path / "first", trained, train.optimizer(mtp.mtp_trainable(trained),
                                                            train.TrainConfig()),
               {"step": 1, "elapsed_s": 1.0, "stage": 0, "stage_start": 0,
                "config": dataclasses.asdict(train.TrainConfig(mtp_main=str(main)))})
    for name in (MTP_CONFIG_NAME, MTP_WEIGHTS_NAME):
        shutil.copy(tmp_path / "first/checkpoint" / name, main / name)
    stored = load_model(main, mtp=True).state_dict()
    model = mtp.mtp_model(str(main), 1, torch.device("cpu"), init=str(main))
    assert all(torch.equal(v, stored[k]) for k, v in model.state_dict().items()
               if k.startswith("mtp."))
    tok, w = train.to_tensors(*train.make_batch(1, 0, 96, 128, 256, 2, "codes"),
                              torch.device("cpu"))
    with torch.no_grad():
        _, one = mtp.mtp_forward(model, tok, None, 1)
        _, three = mtp.mtp_forward(model, tok, None, 3)
    assert len(three) == 3 and torch.equal(one[0], three[0])
    assert not torch.equal(three[0], three[1])  # depth 2 reads the MTP layer's own streams
    model.ops = training_ops()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = dataclasses.replace(train.TrainConfig(), mtp_main=str(main), mtp_depths=3, workers=0)
    stats, _ = train.optimize(model, train.optimizer(mtp.mtp_trainable(model), cfg), cfg, tok, w,
                              1e-3, False)
    assert {"answer_ce", "answer_ce_d2", "answer_ce_d3"} <= stats.keys()
    moved = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert moved and all(k.startswith("mtp.") for k in moved)
