"""`localise`'s SGLang path against every verified release's own dumper.

- the contract (env names, the routes, the file naming, the saved format, non-intrusive naming,
  the loader's parsing, the comparator's flags, the flags that turn CUDA graphs off) read from
  each release's source is the one `localise/sglang_run.py` drives;
- dumps written by each release's own `dumper.py` (tests/sglang/release_dumper.py: as it is
  where it imports, else with its transport imports cut) on the embedded engine's model, on CPU
  tensors, are read with that release's own `dump_loader.py` functions and localised by the
  same rule as the embedded path: the fault's module is named, a harmless change is not.
Every one of the 13 verified releases (0.5.13 … 0.5.23) ships the dumper.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from wheels import VERSIONS, tiered, wheel_of

from dsv4bisect.localise.sglang_contract import (
    EXPECTED,
    comparator_command,
    launch_env,
    problems,
    read_contract,
)
from dsv4bisect.plugin.static import SourceTree


@pytest.fixture(autouse=True)
def _no_sglang_left_behind() -> Iterator[None]:
    """A release's dumper imports `sglang...` lazily; with `tests/` on sys.path (pytest puts a
    rootdir conftest's folder there) that finds `tests/sglang/` as a namespace package and
    leaves `sglang` in sys.modules, which the synthetic-SGLang tests then refuse to build on."""
    before = set(sys.modules)
    yield
    for name in [m for m in sys.modules if m not in before
                 and (m == "sglang" or m.startswith("sglang."))]:
        del sys.modules[name]


def test_every_verified_release_has_the_dumper_localise_drives(wheel: Path) -> None:
    c = read_contract(SourceTree(wheel))
    assert problems(c) == [], c.release
    assert c.filename_keys[:3] == EXPECTED["filename_keys"]
    # CUDA graphs off: one flag from 0.5.14 on (it stands for decode and prefill), two before
    two = ("--disable-cuda-graph", "--disable-piecewise-cuda-graph")
    assert c.graphs_off == (two if c.release in ("0.5.13", "0.5.13.post1")
                            else ("--disable-cuda-graph",))


def test_the_launch_env_is_what_the_release_reads(wheel: Path, tmp_path: Path) -> None:
    c = read_contract(SourceTree(wheel))
    env = launch_env(str(tmp_path), c)
    assert env == {"DUMPER_ENABLE": "0", "DUMPER_NON_INTRUSIVE_MODE": "all",
                   "DUMPER_SERVER_PORT": "reuse", "DUMPER_DIR": str(tmp_path),
                   "DUMPER_ENABLE_OUTPUT_CONSOLE": "0"}
    assert {k.removeprefix(c.env_prefix or "").lower() for k in env} <= set(c.fields)
    assert comparator_command("A", "B")[:3] == ["python", "-m",
                                                "sglang.srt.debug_utils.comparator"]


def test_an_sglang_profile_launches_with_the_dumper_and_graphs_off(tmp_path: Path) -> None:
    from dsv4bisect.config.resolve import resolve
    from dsv4bisect.localise.sglang_contract import DumperContract
    from dsv4bisect.localise.sglang_run import with_dumper

    cfg = resolve("dsv4-flash-tp8")
    contract = DumperContract(**{**{f: None for f in DumperContract.__dataclass_fields__},
                                 **EXPECTED, "release": "x", "layer_pattern": "layers",
                                 "graphs_off": ("--disable-cuda-graph",), "notes": ()})
    launched = with_dumper(cfg, tmp_path / "d", contract)
    for proc in launched.processes:
        env = dict(proc.env)
        assert env["DUMPER_SERVER_PORT"] == "reuse" and env["DUMPER_DIR"] == str(tmp_path / "d")
        assert "--disable-cuda-graph" in proc.argv
    assert launched.fingerprint == cfg.fingerprint  # the ends compared are the profile's


# the first release (imports as it is) and the newest (transport imports cut) in the fast
# suite, every other verified release in the slow one (~10 s each on the 2-core CPU)
_DUMP_VERSIONS = tiered(VERSIONS, fast=(VERSIONS[0], VERSIONS[-1]))


@pytest.mark.parametrize("version", _DUMP_VERSIONS)
def test_dumps_of_the_release_own_dumper_are_localised(version: str, tmp_path: Path) -> None:
    import release_dumper

    wheel = wheel_of(version)

    torch = pytest.importorskip("torch")
    from dsv4bisect.localise import protocol as P
    from dsv4bisect.localise.judge import localise, null_comparisons
    from dsv4bisect.localise.sglang_dumps import load_capture, release_loader
    from dsv4bisect.reference.engine import ReferenceEngine

    module, how = release_dumper.load(wheel)
    engine = ReferenceEngine.load(None, precision="deployment")
    ids = tuple((11 * i + 5) % 500 + 5 for i in range(48))
    transcripts = [P.Transcript("t", ids, len(ids))]

    def dump(exp: str, arm: P.Arm, patches: dict[str, str]) -> Path:
        engine.switch(patches)
        cfg = module.DumperConfig(enable=True, dir=str(tmp_path), exp_name=exp,
                                  non_intrusive_mode="all", enable_output_console=False,
                                  filter="layer_id is None or layer_id <= 1")
        dumper = module._Dumper(config=cfg)
        hooks = dumper.register_non_intrusive_dumper(engine.model)
        caches = {0: engine.model.new_cache()}
        with torch.inference_mode():
            for rows in P.schedule(transcripts, arm, 2048):
                r = rows[0]
                tokens = torch.tensor(ids[r.start:r.start + r.n])
                dumper.dump("input_ids", tokens)  # the core fields SGLang dumps per forward
                dumper.dump("positions", torch.arange(r.start, r.start + r.n))
                engine.model.logits(engine.model.forward_ragged([(tokens, caches[0])]))
                dumper.step()
        hooks.remove()
        return tmp_path / exp

    good_dir = dump("good", P.BASE, {})
    null_dir = dump("rechunk", P.Arm("rechunk@0.5", 0.5), {})
    bad_dir = dump("bad", P.BASE, {"fp8-wo-a-gemm": "scale-layout"})
    engine.switch({})
    names = [p.name for p in good_dir.glob("*.pt")]
    assert names and all(n.startswith("step=") and "___rank=0___dump_index=" in n
                         for n in names), how
    loader = release_loader(release_dumper.loader_source(wheel))
    good = load_capture(good_dir, loader, [ids])
    null = {k: [v] for k, v in null_comparisons(
        good, "rechunk@0.5", load_capture(null_dir, loader, [ids])).items()}
    assert "layers.0.attn.wo_b:inputs.0" in good.sites, how
    harmless = localise(good, load_capture(null_dir, loader, [ids]), null)
    assert harmless.first is None
    first = localise(good, load_capture(bad_dir, loader, [ids]), null).first
    # the fault is in how the wo_a GEMM reads the attention output: the embedded engine's
    # `wo_a_input` place (a module, so the dumper's hooks see it) is the first dumped tensor
    # outside its envelope
    assert first is not None, how
    assert first.site.key == "layers.0.attn.wo_a_input:output", (first.site.key, how)
