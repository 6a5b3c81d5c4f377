"""Golden tests: the exact argv and env of every shipped SGLang profile.

A change here changes what is launched on the real deployment, so it must be deliberate:
regenerate with `DSV4BISECT_UPDATE_GOLDEN=1 pytest tests/foundation/test_golden.py` and review
the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dsv4bisect.config.resolve import resolve

GOLDEN = Path(__file__).parents[1] / "golden"
PROFILES = ["dsv4-flash-tp8", "dsv4-flash-tp8-all", "dsv4-flash-pd8", "dsv4-flash-pd8-all",
            "dsv4-flash-tp8-latest", "dsv4-flash-tp8-latest-all",
            "reference", "reference-all", "reference-pd"]


def _snapshot(name: str) -> dict:
    cfg = resolve(name)
    return {
        "entry_role": cfg.entry_role,
        "patch_set": cfg.patch_set,
        "processes": [
            {"role": p.role, "argv": list(p.argv), "env": dict(p.env), "gpus": list(p.gpus),
             "port": p.port, "ready_path": p.ready_path, "schedulers": p.schedulers}
            for p in cfg.processes
        ],
    }


@pytest.mark.parametrize("name", PROFILES)
def test_resolved_processes_match_golden(name: str) -> None:
    path = GOLDEN / f"{name}.json"
    snapshot = _snapshot(name)
    if os.environ.get("DSV4BISECT_UPDATE_GOLDEN"):
        path.write_text(json.dumps(snapshot, indent=2) + "\n")
    assert snapshot == json.loads(path.read_text())


def test_pd_router_points_at_prefill_bootstrap_port_and_decode() -> None:
    cfg = resolve("dsv4-flash-pd8")
    router = cfg.process("router").argv
    i = router.index("--prefill")
    assert router[i + 1] == "http://127.0.0.1:{port:prefill}" and router[i + 2] == "8998"
    assert router[router.index("--decode") + 1] == "http://127.0.0.1:{port:decode}"
    prefill = cfg.process("prefill")
    assert prefill.env_dict()["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert cfg.process("decode").env_dict()["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert not cfg.process("router").gets_patches
