"""The preflight (engines/preflight.py) through the real command line, one test per check.

Each engine environment here is real: a Python interpreter (behind a two-line shell wrapper
that gives it its own PYTHONPATH, or `-S` to hide site-packages) in which an "installed"
SGLang is a real `sglang-<V>.dist-info` + `sglang/` package on that path, so importlib.metadata
and `import sglang` answer as they would for a pip install. The one stand-in is `nvidia-smi`:
a fixture script on PATH that answers exactly the two queries the preflight makes (this box
has no GPU). Every failure must be one `error:` line and one `hint:` line, with exit 5 (setup)
or 125 (transient), in under 5 s, before anything is launched.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dsv4bisect.config.resolve import Overrides, load_profile, resolve_loaded
from dsv4bisect.engines import preflight as pf

BASE = "dsv4-flash-tp8-latest-all"  # SGLang 0.5.23, NVFP4, GPUs 0-7, six candidates
NO_SMI_PATH = "/nonexistent-bin"  # a PATH on which no nvidia-smi can be found
IDLE = [f"{i}, GPU-{i:04d}-uuid, 1, 97887" for i in range(8)]


def _site(root: Path, version: str | None, init: str = "") -> Path:
    """A site directory in which SGLang `version` is installed (None: nothing installed)."""
    site = root / f"site-{version}"
    site.mkdir(parents=True, exist_ok=True)
    if version is not None:
        dist = site / f"sglang-{version}.dist-info"
        dist.mkdir(exist_ok=True)
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
        (site / "sglang").mkdir(exist_ok=True)
        (site / "sglang" / "__init__.py").write_text(init)
    return site


def _engine_python(root: Path, site: Path | None, *, no_site: bool = False) -> Path:
    """An engine environment's interpreter: this Python with `site` first on its path (the
    editable dsv4bisect install, and with it the plugin's entry point, stays visible unless
    `no_site`, which hides site-packages altogether)."""
    exe = root / f"python-{site.name if site else 'bare'}{'-S' if no_site else ''}"
    env = f"PYTHONPATH={site} " if site else ""
    flag = " -S" if no_site else ""
    exe.write_text(f"#!/bin/sh\n{env}exec {sys.executable}{flag} \"$@\"\n")
    exe.chmod(0o755)
    return exe


def _model(root: Path, arch: str = "DeepseekV4ForCausalLM", quant: dict | None = None,
           hf_algo: str | None = "NVFP4") -> Path:
    d = root / f"model-{arch}-{hf_algo}"
    d.mkdir(exist_ok=True)
    cfg = {"architectures": [arch], "model_type": "deepseek_v4"}
    cfg["quantization_config"] = quant if quant is not None else {"quant_method": "modelopt"}
    (d / "config.json").write_text(json.dumps(cfg))
    if hf_algo:
        (d / "hf_quant_config.json").write_text(json.dumps(
            {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": hf_algo}}))
    return d


def _smi(root: Path, gpus: list[str], apps: list[str] = ()) -> str:
    """A PATH whose nvidia-smi prints `gpus` and `apps` for the preflight's two queries."""
    bin_dir = root / "smi-bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    nl = "\n"
    (bin_dir / "nvidia-smi").write_text(
        "#!/bin/sh\ncase \"$*\" in\n"
        "  '--query-gpu=index,uuid,memory.used,memory.total --format=csv,noheader,nounits')\n"
        f"    cat <<'EOF'\n{nl.join(gpus)}\nEOF\n    ;;\n"
        "  '--query-compute-apps=gpu_uuid,pid,process_name,used_memory "
        "--format=csv,noheader,nounits')\n"
        f"    cat <<'EOF'\n{nl.join(apps)}\nEOF\n    ;;\n"
        "  *) echo \"fixture nvidia-smi: unexpected arguments: $*\" >&2; exit 2;;\nesac\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    return os.pathsep.join((str(bin_dir), "/usr/bin", "/bin"))


def _profile(root: Path, python: Path, model: Path | str, **engine: object) -> Path:
    data = {"schema_version": 1, "name": "pf", "extends": BASE,
            "engine": {"python": str(python), "model": str(model), **engine}}
    path = root / "pf.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _cli(cli, *args: str, path: str = NO_SMI_PATH, cwd: Path | None = None
         ) -> tuple[subprocess.CompletedProcess[str], float]:
    """The shared `cli` with this PATH (its nvidia-smi) and no unverified-SGLang override,
    timed (the preflight answers in seconds)."""
    # Not from the checkout: its dsv4bisect.egg-info on sys.path[0] would register the plugin
    # for any Python started there (as it would for an engine launched from there).
    cwd = cwd or Path(os.environ.get("TMPDIR", "/tmp"))
    t0 = time.monotonic()
    # a hang guard, not a speed bound: a bisect's question and plan line come before its
    # preflight, a minute of simulation on a loaded 2-core machine
    proc = cli(*args, cwd=cwd, timeout=600,
               env={"PATH": path, "DSV4BISECT_ALLOW_UNVERIFIED_SGLANG": None})
    return proc, time.monotonic() - t0


def _one_error(proc: subprocess.CompletedProcess[str], seconds: float, code: int,
               *needles: str) -> str:
    """The run's stderr is exactly `error: preflight: ...` + `hint: ...`, in < 5 s."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(lines) == 2 and lines[0].startswith("error: preflight: ") \
        and lines[1].startswith("hint: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert seconds < 5, f"{seconds:.1f} s"
    print(f"{seconds:.1f} s, exit {code}: {lines[0]}")
    return lines[0]


@pytest.fixture()
def good(tmp_path: Path) -> dict[str, Path]:
    """An engine Python with SGLang 0.5.23 and the plugin, an NVFP4 DeepSeek-V4 model."""
    return {"python": _engine_python(tmp_path, _site(tmp_path, "0.5.23")),
            "model": _model(tmp_path)}


def test_engine_python_that_does_not_run(cli, tmp_path: Path) -> None:
    broken = tmp_path / "python-broken"
    broken.write_text("#!/bin/sh\necho 'libpython3.11.so.1.0: cannot open shared object' >&2\n"
                      "exit 127\n")
    broken.chmod(0o755)
    proc, s = _cli(cli, "run", str(_profile(tmp_path, broken, tmp_path)))
    _one_error(proc, s, 5, "does not run", "cannot open shared object")
    missing = pf.sglang_checks(str(tmp_path / "no-such-python"), "0.5.23", False)
    assert [(f.check, f.status) for f in missing] == [("engine Python", "fail")]
    assert "no-such-python` not found" in missing[0].detail


def test_engine_python_without_sglang(cli, tmp_path: Path) -> None:
    bare = _engine_python(tmp_path, None, no_site=True)  # python -S: no site-packages at all
    proc, s = _cli(cli, "run", str(_profile(tmp_path, bare, tmp_path)))
    _one_error(proc, s, 5, "SGLang is not installed in the engine Python", str(bare))
    assert "install SGLang 0.5.23 there" in proc.stderr


def test_sglang_at_another_release_than_the_pin(cli, tmp_path: Path) -> None:
    py = _engine_python(tmp_path, _site(tmp_path, "0.5.22"))
    proc, s = _cli(cli, "run", str(_profile(tmp_path, py, tmp_path)))
    _one_error(proc, s, 5, "SGLang 0.5.22 is installed", "pins engine.sglang_version 0.5.23")
    assert "pip install sglang==0.5.23" in proc.stderr


def test_unverified_sglang_refused_unless_allowed(cli, tmp_path: Path, good: dict[str, Path]
                                                  ) -> None:
    py = _engine_python(tmp_path, _site(tmp_path, "0.5.24"))
    prof = _profile(tmp_path, py, tmp_path / "absent-model", sglang_version="0.5.24")
    proc, s = _cli(cli, "run", str(prof))
    _one_error(proc, s, 5, "SGLang 0.5.24 is not a verified release (newest verified: 0.5.23)")
    assert "engine.allow_unverified_sglang" in proc.stderr
    # opted in (the profile key, as --set engine.allow_unverified_sglang=true gives it)
    allowed = pf.sglang_checks(str(py), "0.5.24", True)
    assert [f.status for f in allowed] == ["ok", "ok", "ok"], allowed
    assert "unverified, allowed" in allowed[1].detail


def test_sglang_that_does_not_import(cli, tmp_path: Path) -> None:
    site = _site(tmp_path, "0.5.23", init="raise ImportError('No module named torch')\n")
    proc, s = _cli(cli, "run", str(_profile(tmp_path, _engine_python(tmp_path, site), tmp_path)))
    _one_error(proc, s, 5, "`import sglang` fails: ImportError: No module named torch")


def test_plugin_not_registered_in_the_engine_python(cli, tmp_path: Path) -> None:
    # SGLang installed, but -S hides the editable dsv4bisect install: no entry point there
    py = _engine_python(tmp_path, _site(tmp_path, "0.5.23"), no_site=True)
    proc, s = _cli(cli, "run", str(_profile(tmp_path, py, tmp_path)))
    _one_error(proc, s, 5, "the dsv4bisect plugin is not registered", "sglang.srt.plugins")
    assert "pip install /path/to/your/dsv4bisect/checkout" in proc.stderr


def test_model_directory_missing_or_not_a_checkpoint(cli, tmp_path: Path,
                                                     good: dict[str, Path]) -> None:
    proc, s = _cli(cli, "run", str(_profile(tmp_path, good["python"], tmp_path / "nope")))
    _one_error(proc, s, 5, f"model directory {tmp_path / 'nope'} does not exist")
    assert "engine.model" in proc.stderr
    empty = tmp_path / "empty-model"
    empty.mkdir()
    assert "config.json is missing" in pf.model_check(str(empty), "nvfp4").detail


def test_model_with_the_wrong_architecture(cli, tmp_path: Path, good: dict[str, Path]) -> None:
    llama = _model(tmp_path, arch="LlamaForCausalLM")
    proc, s = _cli(cli, "run", str(_profile(tmp_path, good["python"], llama)))
    _one_error(proc, s, 5, "architectures ['LlamaForCausalLM'], not DeepSeek-V4 "
               "(DeepseekV4ForCausalLM)")


def test_model_with_the_wrong_quantization(cli, tmp_path: Path, good: dict[str, Path]) -> None:
    # DeepSeek's own release: FP8 blocks with MXFP4 routed experts, against an NVFP4 profile
    mx = _model(tmp_path, quant={"quant_method": "fp8", "fmt": "e4m3", "expert_dtype": "fp4"},
                hf_algo=None)
    proc, s = _cli(cli, "run", str(_profile(tmp_path, good["python"], mx)))
    _one_error(proc, s, 5, "routed experts are mxfp4 (quant_method fp8, expert_dtype fp4)",
               "engine.expert_quant: nvfp4")
    assert "engine.expert_quant: mxfp4" in proc.stderr


def test_no_nvidia_smi_for_a_profile_that_names_gpus(cli, tmp_path: Path,
                                                     good: dict[str, Path]) -> None:
    proc, s = _cli(cli, "run", str(_profile(tmp_path, good["python"], good["model"])))
    _one_error(proc, s, 5, "nvidia-smi not found: cannot see GPUs 0,1,2,3,4,5,6,7")


def test_gpu_missing_busy_or_short_of_memory(cli, tmp_path: Path, good: dict[str, Path]) -> None:
    prof = str(_profile(tmp_path, good["python"], good["model"]))
    busy = ["GPU-0003-uuid, 4242, python3 -m vllm.entrypoints.openai.api_server, 70000"]
    proc, s = _cli(cli, "run", prof, path=_smi(tmp_path / "busy", IDLE, busy))
    _one_error(proc, s, 125, "GPU 3 is busy: PID 4242 (python3 -m vllm")
    smi = str(tmp_path / "{}" / "smi-bin" / "nvidia-smi")
    _smi(tmp_path / "four", IDLE[:4])
    four = pf.gpu_check(list(range(8)), smi.format("four"))
    assert four.failed and not four.transient
    assert "GPU 4,5,6,7 named by the profile is not visible (nvidia-smi shows 0,1,2,3)" \
        in four.detail
    _smi(tmp_path / "full", IDLE[:5] + ["5, GPU-0005-uuid, 20000, 97887"] + IDLE[6:])
    full = pf.gpu_check(list(range(8)), smi.format("full"))
    assert full.failed and full.transient and full.error().exit_code == 125
    assert "GPU 5 has only 80% of its memory free (20000 of 97887 MiB used;" in full.detail
    assert pf.gpu_check([0, 1], smi.format("busy")).status == "ok"  # GPU 3 busy, not named


def test_everything_in_place_passes(tmp_path: Path, good: dict[str, Path],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The same checks with nothing wrong: every finding ok (ports: none fixed)."""
    prof = _profile(tmp_path, good["python"], good["model"])
    monkeypatch.setenv("PATH", _smi(tmp_path, IDLE))
    loaded = load_profile(str(prof), Overrides())
    found = pf.preflight(loaded, resolve_loaded(loaded))
    assert [(f.check, f.status) for f in found] == [
        ("engine Python", "ok"), ("SGLang", "ok"), ("plugin", "ok"), ("model", "ok"),
        ("GPUs", "ok"), ("ports", "skip")], found
    assert "0.5.23" in found[1].detail and "experts nvfp4" in found[3].detail


def _listening() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_taken_port_names_its_holder_embedded_profile_too(cli) -> None:
    with _listening() as held:
        port = held.getsockname()[1]
        proc, s = _cli(cli, "run", "reference-all", "--set", f"engine.port={port}")
        _one_error(proc, s, 125, f"port {port} is held by PID {os.getpid()}", "`server`")


def test_skip_preflight_leaves_it_to_the_launcher(cli, tmp_path: Path) -> None:
    """With --skip-preflight the launcher's own check (the same port_holder) is what refuses."""
    with _listening() as held:
        port = held.getsockname()[1]
        proc, _ = _cli(cli, "run", "reference-all", "--set", f"engine.port={port}",
                       "--skip-preflight", "--out", str(tmp_path / "runs"))
    assert proc.returncode == 125, proc.stderr
    assert "error: preflight" not in proc.stderr and "(before launch)" in proc.stderr


@pytest.mark.slow  # plans of the standard tier: ~1 min of simulation on 2 cores (issue 42's 400 runs)
def test_bisect_runs_the_preflight_but_not_for_plan(cli, tmp_path: Path,
                                                    good: dict[str, Path]) -> None:
    prof = str(_profile(tmp_path, good["python"], tmp_path / "nope"))
    proc, s = _cli(cli, "bisect", prof, "--out", str(tmp_path / "runs"), cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 5 and lines[-2].startswith("error: preflight: model directory")
    assert not (tmp_path / "runs").exists()  # refused before the runs root or ledger exist
    proc, _ = _cli(cli, "bisect", prof, "--plan", cwd=tmp_path)
    assert proc.returncode == 0 and "plan: 6 candidates" in proc.stdout + proc.stderr


def test_doctor_shows_the_preflight_rows(cli, tmp_path: Path, good: dict[str, Path]) -> None:
    llama = _model(tmp_path, arch="LlamaForCausalLM")
    proc, _ = _cli(cli, "doctor", str(_profile(tmp_path, good["python"], llama)), "--json",
                   path=_smi(tmp_path, IDLE))
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert proc.returncode == 1, rows
    assert rows["preflight: model"]["status"] == "fail"
    assert "not DeepSeek-V4" in rows["preflight: model"]["detail"]
    assert rows["preflight: GPUs"]["status"] == "ok"
    assert rows["preflight: SGLang"]["status"] == "ok"


def test_checkpoint_quant_reads_modelopt_and_deepseek_configs(tmp_path: Path) -> None:
    cases = [({"quant_method": "modelopt"}, "NVFP4", "nvfp4"),
             ({"quant_method": "modelopt"}, "MIXED_PRECISION", "nvfp4"),
             ({"quant_method": "modelopt"}, "FP8", "fp8"),
             ({"quant_method": "fp8", "fmt": "e4m3"}, None, "fp8"),
             ({"quant_method": "fp8", "expert_dtype": "fp4"}, None, "mxfp4"),
             ({}, None, "bf16"), ({"quant_method": "awq"}, None, "awq")]
    for i, (qc, algo, want) in enumerate(cases):
        d = tmp_path / str(i)
        d.mkdir()
        if algo:
            (d / "hf_quant_config.json").write_text(json.dumps({"quantization":
                                                                {"quant_algo": algo}}))
        cfg = {"architectures": ["DeepseekV4ForCausalLM"]}
        if qc:
            cfg["quantization_config"] = qc
        assert pf.checkpoint_quant(d, cfg)[0] == want, (qc, algo)
