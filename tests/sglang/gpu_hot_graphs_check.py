"""GPU check: a CUDA graph bakes the hot gate's choice, and re-capturing after a switch picks
up the new state — why the SGLang hot switch re-captures the decode graphs
(docs/hot-switching.md, "SGLang").

    python tests/sglang/gpu_hot_graphs_check.py --wheels DIR --out OUT_DIR   # ~1 min on an H200

For each SGLang wheel in DIR (read, never installed; a zip holding the modules the tree reads
will do): the synthetic `sglang` tree (sglang_tree.py) with the wheel's Scheduler.flush_cache,
mhc-bf16 installed through the real plugin in hot mode (`plugin.hot.install_hot`: gated,
launched off, `DSV4BISECT_HOT=mhc-bf16`), `hc_pre` at x [32, 4, 4096], fn [24, 16384] on CUDA:
1. captured with the patch off, then switched on: the replay is still SGLang's original, bit
   for bit, while an eager call runs the bf16 hook;
2. re-captured: the replay equals the eager bf16 hook;
3. switched off: the replay is still the bf16 path; re-captured: SGLang's original again.
Also the gate's cost per call while off (eager, against the unhooked original). Writes
OUT_DIR/gpu_hot_graphs_check.{json,md}; exit 1 if any check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import gpu_paths  # noqa: E402, F401  (sys.path and the package's layout)
import torch  # noqa: E402
from hookenv import PROC  # noqa: E402
from sglang_tree import SglangTree, add_scheduler, decoder_layer  # noqa: E402

from dsv4bisect.base.versions import check_version  # noqa: E402
from dsv4bisect.patching.registry import builtin_patches  # noqa: E402
from dsv4bisect.plugin.hot import apply_state, install_hot  # noqa: E402
from dsv4bisect.plugin.receipts import ReceiptWriter  # noqa: E402

ROWS: list[dict] = []


def _capture(fn):  # returns (graph, output buffer)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


def _replay(graph, out) -> torch.Tensor:
    graph.replay()
    torch.cuda.synchronize()
    return out.clone()


def _us(fn, reps: int = 200) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps * 1e6


def check(version: str, wheel: Path, out_dir: Path) -> None:
    def row(check: str, ok: bool, **kw: object) -> None:
        ROWS.append(dict(version=version, check=check, ok=bool(ok), **kw))
        print(f"{version:8} {check:55} {'ok' if ok else 'FAIL'} {kw}", flush=True)

    with SglangTree(wheel) as tree:
        add_scheduler(tree)
        import sglang.srt.models.deepseek_v4 as v4

        cls = v4.DeepseekV4DecoderLayer
        layer = decoder_layer(cls)
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(32, 4, 4096, device="cuda", generator=g).to(torch.bfloat16)
        fn = torch.randn(24, 16384, device="cuda", generator=g) * 16384 ** -0.5
        scale = torch.tensor([0.8, 1.1, 0.9], device="cuda")
        base = torch.randn(24, device="cuda", generator=g) * 0.1

        def call() -> torch.Tensor:
            return cls.hc_pre(layer, x, fn, scale, base)[0]

        stock = call()
        us_stock = _us(call)
        receipts, state = install_hot(
            {}, {"mhc-bf16": "bf16"}, check_version(version), ReceiptWriter(None, PROC),
            builtin_patches(), out_dir)
        states = {r.patch: r.state for r in receipts}
        row("install_hot: flush_cache switch installed", states.get("hot-switch") == "installed",
            receipts=states)
        off = call()
        row("gate off, eager = SGLang's original (bit for bit)", torch.equal(off, stock),
            us_original=round(us_stock, 1), us_gated_off=round(_us(call), 1))
        graph, buf = _capture(call)
        apply_state(state, {"mhc-bf16": "bf16"})
        eager_on = call()
        diff = float((eager_on.float() - stock.float()).norm() / stock.float().norm())
        row("switched on: eager runs the bf16 hook", 1e-6 < diff < 3e-2, rel_vs_stock=diff)
        row("switched on: old graph still replays the original (stale)",
            torch.equal(_replay(graph, buf), stock))
        graph, buf = _capture(call)
        row("re-captured: replay = eager bf16 hook", torch.equal(_replay(graph, buf), eager_on))
        apply_state(state, {})
        row("switched off: old graph still replays the bf16 hook (stale)",
            torch.equal(_replay(graph, buf), eager_on))
        graph, buf = _capture(call)
        row("re-captured: replay = SGLang's original", torch.equal(_replay(graph, buf), stock))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--wheels", type=Path, required=True, help="folder with sglang-*.whl")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 2
    import triton

    wheels = {w.name.split("-")[1]: w for w in sorted(args.wheels.glob("sglang-*.whl"))}
    env = dict(torch=torch.__version__, triton=triton.__version__, wheels=sorted(wheels),
               gpu=torch.cuda.get_device_name())
    print(env, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    for version, wheel in wheels.items():
        check(version, wheel, args.out / f"switch-{version}")
    (args.out / "gpu_hot_graphs_check.json").write_text(json.dumps(dict(env=env, rows=ROWS),
                                                                   indent=1, default=str))
    lines = [str(env), "", "| SGLang | check | ok | detail |", "| --- | --- | --- | --- |"]
    for r in ROWS:
        detail = {k: v for k, v in r.items() if k not in ("version", "check", "ok")}
        lines.append(f"| {r['version']} | {r['check']} | {'yes' if r['ok'] else 'NO'} | "
                     f"{detail or ''} |")
    (args.out / "gpu_hot_graphs_check.md").write_text("\n".join(lines) + "\n")
    bad = [r for r in ROWS if not r["ok"]]
    print(f"{len(ROWS) - len(bad)} of {len(ROWS)} passed")
    return 1 if bad or not ROWS else 0


if __name__ == "__main__":
    sys.exit(main())
