"""Switch discovery's rule on a small SGLang-shaped tree written here (the wheels are read by
tests/sglang/test_switch_catalog.py): which reads are on DeepSeek-V4's path, the reading
mode of each, hot, per-architecture defaults, forced values, import-time copies, arguments."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsv4bisect.plugin.discover import discover
from dsv4bisect.plugin.static import SourceTree

FILES = {
    "sglang/srt/environ.py": '''
class Envs:
    SGLANG_OPT_AT_IMPORT = EnvBool(True)
    SGLANG_OPT_COPY = EnvStr("flashinfer")
    SGLANG_OPT_AT_INIT = EnvBool(False)
    SGLANG_OPT_PER_CALL = EnvBool(False)
    SGLANG_OPT_HELPER = EnvBool(True)
    SGLANG_OPT_SET_ON_SM120 = EnvBool(True)
    SGLANG_OPT_FORCED = EnvBool(True)
    SGLANG_DSV4_QUANT = EnvBool(True)
    SGLANG_ON_HIP = EnvBool(_default_hip)
    SGLANG_LORA_THING = EnvBool(False)
    SGLANG_SHARED_ELSEWHERE = EnvInt(3)
''',
    "sglang/srt/models/deepseek_v4.py": '''
import os
_AT_IMPORT = envs.SGLANG_OPT_AT_IMPORT.get()
_COPY = envs.SGLANG_OPT_COPY.get()
_ON_HIP = envs.SGLANG_ON_HIP.get()
NAME = "SGLANG_DSV4_RAW"

def _helper():
    return envs.SGLANG_OPT_HELPER.get()

class Layer:
    def __init__(self):
        self.fused = envs.SGLANG_OPT_AT_INIT.get() and _helper()
        self.fp8 = _AT_IMPORT and envs.SGLANG_OPT_FORCED.get()

    def forward(self, x):
        if _AT_IMPORT:
            x = x + 1
        if envs.SGLANG_OPT_PER_CALL.get() or os.environ.get(NAME, "0") == "1":
            return x
        return _helper() and x if _COPY == "triton" else x
''',
    "sglang/srt/configs/model_config.py": '''
class ModelConfig:
    def __init__(self, hf):
        if is_deepseek_v4(hf):
            self.fp4 = envs.SGLANG_DSV4_QUANT.get()
        self.lora = envs.SGLANG_LORA_THING.get()
''',
    "sglang/srt/arg_groups/model_hook.py": '''
def handle(server_args, model_arch):
    if model_arch in ["DeepseekV4ForCausalLM"]:
        if get_platform().is_sm120:
            if not envs.SGLANG_OPT_SET_ON_SM120.is_set():
                envs.SGLANG_OPT_SET_ON_SM120.set(False)
            envs.SGLANG_OPT_FORCED.set(False)
            envs.SGLANG_SHARED_ELSEWHERE.set(1)
            if server_args.moe_runner_backend == "auto":
                server_args.moe_runner_backend = "marlin"
        if not get_platform().is_hip and get_platform().is_sm100 and fp4_checkpoint:
            server_args.moe_runner_backend = "flashinfer_mxfp4"
            server_args.tp_size = 4
''',
    "sglang/srt/layers/shared_thing.py": '''
def step():
    return envs.SGLANG_SHARED_ELSEWHERE.get()
''',
    "sglang/srt/lora/lora_manager.py": '''
def load():
    return envs.SGLANG_LORA_THING.get()
''',
    "sglang/srt/server_args.py": '''
@dataclass
class ServerArgs:
    kv_cache_dtype: str = "auto"
    moe_runner_backend: str = "auto"
    tp_size: int = 1
    chunked_prefill_size: Optional[int] = None
    lora_backend: str = "triton"
    mm_attention_backend: Optional[str] = None
    host: str = "127.0.0.1"
''',
}


# What the switch file could carry in this tree (a patch's per-call env rule): SGLANG_DSV4_RAW
# is read per call but no patch models it, SGLANG_OPT_AT_INIT is modelled but read at load.
DELIVERABLE = frozenset({"SGLANG_OPT_PER_CALL", "SGLANG_OPT_COPY", "SGLANG_SHARED_ELSEWHERE",
                         "SGLANG_OPT_AT_INIT"})


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory):
    root: Path = tmp_path_factory.mktemp("tree")
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return discover(SourceTree(root), "9.9.9", deliverable=DELIVERABLE)


def test_only_the_v4_path_is_listed(catalog) -> None:
    assert catalog.release == "9.9.9"
    assert "SGLANG_LORA_THING" not in catalog.names()  # read outside any V4 block
    assert catalog.names() == [
        "SGLANG_DSV4_QUANT", "SGLANG_DSV4_RAW", "SGLANG_ON_HIP", "SGLANG_OPT_AT_IMPORT",
        "SGLANG_OPT_AT_INIT", "SGLANG_OPT_COPY", "SGLANG_OPT_FORCED", "SGLANG_OPT_HELPER",
        "SGLANG_OPT_PER_CALL", "SGLANG_OPT_SET_ON_SM120", "SGLANG_SHARED_ELSEWHERE",
        "--chunked-prefill-size", "--kv-cache-dtype", "--moe-runner-backend", "--tp-size"]


@pytest.mark.parametrize(("name", "read", "hot"), [
    ("SGLANG_OPT_AT_IMPORT", "import", False),  # its global is also read in __init__
    ("SGLANG_OPT_AT_INIT", "construction", False),
    ("SGLANG_OPT_PER_CALL", "call", True),
    ("SGLANG_DSV4_RAW", "call", False),  # os.environ.get per call, but not deliverable
    ("SGLANG_OPT_HELPER", "construction", False),  # asked per call, but decided in __init__
    ("SGLANG_DSV4_QUANT", "construction", False),
    ("SGLANG_OPT_COPY", "call", True),  # a copy read only per call
])
def test_reading_modes_and_hot(catalog, name: str, read: str, hot: bool) -> None:
    switch = catalog.by_name(name)
    assert (switch.read, switch.hot) == (read, hot), switch


def test_copies_defaults_per_architecture_and_forced(catalog) -> None:
    assert catalog.by_name("SGLANG_OPT_COPY").copies == ("sglang.srt.models.deepseek_v4._COPY",)
    assert catalog.by_name("SGLANG_ON_HIP").default == {"default": False, "hip": True}
    on_sm120 = catalog.by_name("SGLANG_OPT_SET_ON_SM120")
    assert on_sm120.default == {"default": True, "sm120": False} and on_sm120.forced == ()
    assert catalog.by_name("SGLANG_OPT_FORCED").forced == ("sm120",)
    elsewhere = catalog.by_name("SGLANG_SHARED_ELSEWHERE")  # set for V4, read by a shared layer
    assert elsewhere.where == "sglang/srt/layers/shared_thing.py:3" and elsewhere.hot
    assert elsewhere.default == {"default": 3, "sm120": 1} and elsewhere.type == "int"


def test_arguments(catalog) -> None:
    kv = catalog.by_name("--kv-cache-dtype")
    assert (kv.kind, kv.type, kv.default, kv.tier) == ("arg", "str", "auto", "precision")
    assert catalog.by_name("--chunked-prefill-size").type == "int|None"
    assert catalog.by_name("tp_size").where == "sglang/srt/server_args.py:6"
    # set under an architecture test alone: a default there; under a checkpoint test: none
    assert catalog.by_name("--moe-runner-backend").default == {"default": "auto",
                                                              "sm120": "marlin"}
    assert catalog.by_name("--tp-size").default == 1


VENDOR_TREE = {"sglang/srt/models/deepseek_v4.py": '''
_is_hip = is_hip()
_is_cuda = is_cuda()
_AND = envs.SGLANG_GUARD_AND.get() and _is_hip

def forward(alt):
    if get_platform().is_npu():
        return envs.SGLANG_GUARD_IF.get()
    if _is_cuda:
        pass
    else:
        x = envs.SGLANG_GUARD_ELSE.get()
    y = alt is not None and (_is_cuda or envs.SGLANG_GUARD_OR.get())
    z = envs.SGLANG_PLAIN.get() or _is_hip
    if not _is_hip:
        w = envs.SGLANG_NOT_HIP.get()
    if _is_hip and envs.SGLANG_BOTH.get():
        pass
    return envs.SGLANG_BOTH.get()
'''}


def test_reads_behind_another_vendors_platform_test(tmp_path: Path) -> None:
    """Issue 41, item 9: where a switch is read says whose GPU it acts on. A read in an `and`
    with `_is_hip` / `is_npu()`, in an `if` body under one, or after `_is_cuda or` never
    matters on NVIDIA; the catalog lists such sites under `other_vendor`."""
    for rel, text in VENDOR_TREE.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    catalog = discover(SourceTree(tmp_path), "9.9.9", deliverable=frozenset())
    behind = {s.name: s.other_vendor for s in catalog.switches if s.kind == "env"}
    for name in ("SGLANG_GUARD_AND", "SGLANG_GUARD_IF", "SGLANG_GUARD_ELSE", "SGLANG_GUARD_OR"):
        assert behind[name] == catalog.by_name(name).sites, name  # its one read is behind
    assert behind["SGLANG_PLAIN"] == () and behind["SGLANG_NOT_HIP"] == ()
    both = catalog.by_name("SGLANG_BOTH")  # one read behind `_is_hip and`, one plain
    v4 = "sglang/srt/models/deepseek_v4.py"
    assert set(both.sites) == {f"{v4}:17", f"{v4}:19"}
    assert both.other_vendor == (f"{v4}:17",)
