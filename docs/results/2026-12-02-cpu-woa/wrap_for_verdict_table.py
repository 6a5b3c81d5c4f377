"""Wraps the raw `--json` outputs kept here into the files `tests/benchmarks/verdict_table.py
--from docs/results/2026-12-02-cpu-woa/verdict` reads (run from the repository root)."""
import json
from pathlib import Path
R = Path("docs/results/2026-12-02-cpu-woa")
out = R / "verdict"
out.mkdir(exist_ok=True)
rows = {
    "fp8-wo-a-gemm.deployment.run.json": ("fp8.run.json", ["dsv4bisect", "run", "reference", "--only", "fp8-wo-a-gemm", "--json"]),
    "fp8-wo-a-gemm-scale-layout.deployment.run.json": ("scale-layout.run.json", ["dsv4bisect", "run", "reference", "--only", "fp8-wo-a-gemm", "--set", "patches.fp8-wo-a-gemm.variant=scale-layout", "--json"]),
    "fp8-wo-a-gemm-scale-layout.deployment.bisect.json": ("scale-layout.bisect.json", ["dsv4bisect", "bisect", "reference-all", "--set", "patches.fp8-wo-a-gemm.variant=scale-layout", "--json"]),
    "fp8-wo-a-gemm-scale-truncate.deployment.run.json": ("scale-truncate.run.json", ["dsv4bisect", "run", "reference", "--only", "fp8-wo-a-gemm", "--set", "patches.fp8-wo-a-gemm.variant=scale-truncate", "--json"]),
    "fp8-wo-a-gemm-scale-layout.exact.run.json": ("scale-layout.exact.run.json", ["dsv4bisect", "run", "reference", "--only", "fp8-wo-a-gemm", "--set", "patches.fp8-wo-a-gemm.variant=scale-layout", "--set", "engine.precision=exact", "--json"]),
    "fp8-wo-a-gemm-scale-truncate.deployment.bisect.json": ("scale-truncate.bisect.json", ["dsv4bisect", "bisect", "reference-all", "--set", "patches.fp8-wo-a-gemm.variant=scale-truncate", "--json"]),
}
for name, (src, cmd) in rows.items():
    f = R / src
    if not f.exists() or not f.read_text().strip():
        continue
    doc = json.loads(f.read_text())
    rc = doc.get("exit_code", 0 if doc.get("status") == "found" else None)
    (out / name).write_text(json.dumps({"command": cmd, "rc": rc, "result": doc,
                                        "copied_from": src}, indent=1))
print(sorted(p.name for p in out.iterdir()))
