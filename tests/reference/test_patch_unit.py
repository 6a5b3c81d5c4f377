"""A patch is one unit: a test-only patch with one fault variant, written as one module in a
temporary package and registered through `DSV4BISECT_TEST_PATCH_MODULES`, is delivered by the
embedded engine, the SGLang plugin and the vLLM plugin from its own file (docs/patches.md,
"Adding a patch")."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import requests
import torch

from dsv4bisect import env as envvars
from dsv4bisect.base.versions import check_version
from dsv4bisect.config.resolve import Overrides, resolve
from dsv4bisect.engines.receipts import check_receipts, read_receipts
from dsv4bisect.patching.registry import builtin_patches
from dsv4bisect.plugin.install import install_patches
from dsv4bisect.plugin.receipts import ProcessInfo, ReceiptWriter
from dsv4bisect.reference.engine import ReferenceEngine
from tests.reference.test_server import free_port, start_server, stop, wait_healthy
from tests.vllm.test_plugin import run_stand_in

MODULE = "unitpkg.probe_negate"
MOE = "vllm.models.deepseek_v4.nvidia.model.DeepseekV4MoE.__init__"
# Everything a new patch needs: its declaration, its embedded swap, its SGLang planner, its vLLM
# delivery (sites per layout) and planner.
PATCH_SOURCE = '''"""probe-negate — a test-only patch: one real variant, one fault variant.

Speeds up: nothing. The fault negates the final state before the norm and the head, so every
logit is negated: the most likely token becomes the least likely. On vLLM the fault's hook only
records each MoE block the worker builds (test only).
"""

from dsv4bisect.patchspec.plan import HookSpec, Plan
from dsv4bisect.patchspec.spec import Patch, Planners, SglangDelivery, Variant, VllmDelivery, VllmSite
from dsv4bisect.patchspec.swaps import Op, Swap

MOE = "vllm.models.deepseek_v4.nvidia.model.DeepseekV4MoE.__init__"


def _negated(site):
    return lambda x: -x


def _sglang(variant, layout, recorder):
    return Plan("inert", reason="probe-negate has nothing to hook on SGLang")


def _vllm(variant, layout, recorder):
    def after(result, block, *args, **kwargs):
        recorder.called(MOE)
        recorder.log("blocks", type(block).__name__)

    return Plan("install", (HookSpec(MOE, "after", after, True),))


PATCH = Patch(
    name="probe-negate",
    summary="test only: its fault negates every logit",
    tier=3,
    touches=("test-only",),
    reference="the final state before the norm and the head, negated by the fault",
    sglang=SglangDelivery(hooks={}),
    variants=(Variant("keep", "changes nothing"),
              Variant("negate", "every logit negated", fault=True)),
    doc=__doc__,
    test_only=True,
    swaps=(Swap(Op.HEAD_INPUT, _negated, ("negate",)),),
    vllm=VllmDelivery("hook", "test only: AFTER the MoE block's construction",
                      variants=("negate",), sites={"0.34.0": (VllmSite(MOE),)}),
    planners=Planners(sglang=_sglang, vllm=_vllm),
)
'''
PROC = ProcessInfo(pid=1, role="server", kind="scheduler", tp_rank=0, dp_rank=0, pp_rank=0)


@pytest.fixture
def unit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The patch's one file in a package of its own, registered for this process and the
    environment of its subprocesses (returned)."""
    package = tmp_path / "unitpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "probe_negate.py").write_text(PATCH_SOURCE)
    path = os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(envvars.TEST_PATCH_MODULES, MODULE)
    return {"PYTHONPATH": path, envvars.TEST_PATCH_MODULES: MODULE}


def test_it_joins_the_registry_after_the_built_ins(unit, cli) -> None:
    known = builtin_patches()
    assert list(known)[-1] == "probe-negate" and known["probe-negate"].test_only
    r = cli("patches", "list", "--json", env=unit)
    assert r.returncode == 0, r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert rows["probe-negate"]["faults"] == ["negate"]


def test_its_fault_swaps_the_op_it_declares_and_its_real_variant_nothing(unit) -> None:
    tokens = torch.randint(2, 512, (40,), generator=torch.Generator().manual_seed(1))
    out = {}
    for patches in ({}, {"probe-negate": "keep"}, {"probe-negate": "negate"}):
        model = ReferenceEngine.load(None, patches=patches, device="cpu", threads=1).model
        with torch.inference_mode():
            out[tuple(patches.values())] = model(tokens)
        negated = patches.get("probe-negate") == "negate"
        assert model.head_input.source == ("probe-negate:negate" if negated else "stock")
    assert torch.equal(out[("keep",)], out[()])
    assert torch.equal(out[("negate",)], -out[()])  # a sign flip is exact through norm and head


def test_the_sglang_plugin_takes_its_planner_from_its_file(unit) -> None:
    receipts = install_patches({"probe-negate": "negate"}, check_version("0.5.23"),
                               ReceiptWriter(None, PROC), builtin_patches(), contract=False)
    assert [(r.patch, r.state, r.reason) for r in receipts] == [
        ("probe-negate", "inert", "probe-negate has nothing to hook on SGLang")]


def test_the_vllm_plugin_takes_its_delivery_and_planner_from_its_file(unit, tmp_path) -> None:
    """The resolver reads its vLLM delivery (a hook for the fault, the real variant not sent)
    and the real plugin installs its planner's hook at its declared site in every worker of
    the stand-in vLLM (tests/vllm/stand_in.py, the 0.34.0 layout; its mHC kernels exist only
    as hooks, so mhc-bf16 goes along)."""
    def config(variant: str) -> object:
        return resolve("dsv4-flash-vllm-tp8", Overrides(sets=(
            "engine.tp=2", "engine.gpus=[0,1]", "engine.vllm_version=0.34.0",
            f"patches.probe-negate.variant={variant}"), enable=("mhc-bf16",)))

    keep = config("keep")
    (choice,) = [c for c in keep.patches if c.name == "probe-negate"]
    assert not choice.delivered and "has no vLLM delivery" in (choice.inert or "")
    cfg = config("negate")
    wire = cfg.processes[0].env_dict()[envvars.PATCHES]
    assert wire == "mhc-bf16,probe-negate:negate"
    receipts = run_stand_in(tmp_path, "fork", wire, env_extra=unit)
    assert check_receipts(cfg, receipts).states == {
        p: {"server/tp0": "installed", "server/tp1": "installed"}
        for p in ("mhc-bf16", "probe-negate")}
    for rec in [r for r in read_receipts(receipts) if r["patch"] == "probe-negate"]:
        assert rec["targets"] == [MOE] and MOE in rec["called"]
        assert rec["detail"]["blocks"] == ["DeepseekV4MoE"]  # the one block the model builds


def test_serve_delivers_it_receipts_it_and_its_fault_negates_the_logits(unit) -> None:
    prompt = torch.randint(2, 512, (30,), generator=torch.Generator().manual_seed(2)).tolist()
    stock = ReferenceEngine.load(None, precision="exact", device="cpu", threads=1)
    want = [_fault_of({i: lp for i, lp in s.top})
            for s in stock.score(prompt, start=1, top_logprobs=512)]
    port = free_port()
    proc = start_server(port, {**unit, envvars.PATCHES: "probe-negate:negate"},
                        "--precision", "exact")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url)
        info = requests.get(f"{url}/server_info", timeout=10).json()
        got = requests.post(f"{url}/generate", timeout=120, json={
            "input_ids": prompt, "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 512}).json()
    finally:
        rc, err = stop(proc)
    assert rc == 0, err
    assert info["patches"] == {"probe-negate": "negate"}
    tops = got["meta_info"]["input_top_logprobs"][1:]  # position 0 has none
    assert len(tops) == len(want) == len(prompt) - 1
    for top, expected in zip(tops, want, strict=True):
        lps = {i: lp for lp, i, _ in top}
        assert max(abs(lps[i] - lp) for i, lp in expected.items()) < 1e-4


def _fault_of(stock: dict[int, float]) -> dict[int, float]:
    """The log-probs of negated logits, from the stock log-probs (which are the logits up to a
    constant): log_softmax(-lp)."""
    m = max(-lp for lp in stock.values())
    lse = m + math.log(sum(math.exp(-lp - m) for lp in stock.values()))
    return {i: -lp - lse for i, lp in stock.items()}


@pytest.mark.parametrize(("source", "message"), [
    (PATCH_SOURCE.replace("    test_only=True,\n", ""), "is not declared test_only"),
    (PATCH_SOURCE.replace('name="probe-negate"', 'name="probe"'), "declares the name `probe`"),
])
def test_a_bad_registration_is_refused_with_a_hint(unit, cli, tmp_path, source, message) -> None:
    (tmp_path / "unitpkg" / "probe_negate.py").write_text(source)
    r = cli("patches", "list", env=unit)
    assert r.returncode == 5 and message in r.stderr and "hint:" in r.stderr
    r = cli("patches", "list", env={**unit, envvars.TEST_PATCH_MODULES: "unitpkg.missing"})
    assert r.returncode == 5 and "cannot import test patch module" in r.stderr
