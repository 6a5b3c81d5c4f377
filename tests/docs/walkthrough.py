"""A fresh-clone walk-through of the README and docs/: every command in a code block, run here
where it runs on the embedded engine, each other one skipped with the reason.

    python tests/docs/walkthrough.py [--workdir DIR] [--list]

What it does: finds the shell command lines of every fenced code block (```bash, ```sh or
bare ```) of README.md and docs/*.md — lines that start with `dsv4bisect`, `python -m
dsv4bisect`, `VAR=… dsv4bisect`, `pip install`, `git bisect`, `python tests/…`, `python -m
sglang`, `curl` or `ray` — and looks each one up in PLAN below. A command the plan does not
know fails the walk-through: a new command in the docs must be classified here (run, or
skipped with a reason), so the docs cannot quietly grow commands nothing runs.

The runs happen in order in a fresh clone of this checkout's HEAD (`git clone`), installed
into its own virtual environment (`--system-site-packages`: the installed torch and the
SGLang wheels cache are this machine's), in a scratch directory: the README's install and
`dsv4bisect run` (smoke tier, minutes), the README's test command with the suite collected
but not run (CI runs it: .ci/run is exactly that command), docs/probe.md's served pair and
drift probe, docs/bisect.md's SGLang-commit SCRIPT's `dsv4bisect probe` against the README
run's directory, docs/sglang.md's install and doctor. `--list` prints the plan of every
command without running anything. tests/docs/test_walkthrough.py runs it (`slow`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHELL_LANGS = ("", "bash", "sh", "shell", "console")
COMMAND = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S+\s+)*(?:dsv4bisect\b|python -m dsv4bisect\b|"
                     r"pip install\b|git bisect\b|python tests/|python -m sglang\b|curl\b|ray\b)")
FENCE = re.compile(r"^\s*```(\w*)")


@dataclass(frozen=True)
class Found:
    doc: str  # path relative to the repository
    line: int
    text: str  # the command line as written (a trailing `# comment` kept)


def found_commands(root: Path = ROOT) -> list[Found]:
    """Every shell command line in a code block of README.md and docs/*.md, in page order."""
    out: list[Found] = []
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        lang: str | None = None
        for number, line in enumerate(page.read_text().splitlines(), 1):
            fence = FENCE.match(line)
            if fence:
                lang = fence.group(1) if lang is None else None
                continue
            text = line.strip()
            if lang in SHELL_LANGS and COMMAND.match(text):
                out.append(Found(str(page.relative_to(root)), number, text))
    return out


# -- the plan: how each command is walked -----------------------------------------------------
@dataclass
class Walk:
    """What the runs share: the clone, its environment, servers, the README run's directory."""

    clone: Path
    scratch: Path
    env: dict[str, str]
    log: Callable[[str], None]
    servers: list[subprocess.Popen[str]]
    run_dir: Path | None = None

    def sh(self, command: str, *, expect: tuple[int, ...] = (0,), timeout: float = 1800,
           cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        self.log(f"$ {command}")
        t0 = time.monotonic()
        proc = subprocess.run(["bash", "-c", command], cwd=cwd or self.clone, env=self.env,
                              capture_output=True, text=True, timeout=timeout, check=False)
        self.log(f"  exit {proc.returncode} in {time.monotonic() - t0:.0f} s")
        if proc.returncode not in expect:
            raise WalkError(f"`{command}` exited {proc.returncode}, expected "
                            f"{'/'.join(map(str, expect))}\n{proc.stdout[-3000:]}\n"
                            f"{proc.stderr[-3000:]}")
        return proc

    def serve(self, patches: str, *extra: str) -> str:
        """A `dsv4bisect serve` of the clone on a free port (stopped at the end)."""
        port = _free_port()
        argv = [self.env["VIRTUAL_ENV"] + "/bin/dsv4bisect", "serve", "--port", str(port),
                *extra]
        return self._start(argv, {"DSV4BISECT_PATCHES": patches}, port)

    def serve_as(self, config: Path) -> str:
        """The server a run's resolved config.json launches: its argv and environment."""
        process = json.loads(config.read_text())["processes"][0]
        port = _free_port()
        argv = [a.replace("{python}", self.env["VIRTUAL_ENV"] + "/bin/python")
                .replace("{port:server}", str(port)) for a in process["argv"]]
        return self._start(argv, dict(process["env"]), port)

    def _start(self, argv: list[str], env: dict[str, str], port: int) -> str:
        self.log(f"$ {' '.join(f'{k}={v}' for k, v in env.items())} {shlex.join(argv)} &")
        proc = subprocess.Popen(argv, cwd=self.clone, text=True, env={**self.env, **env},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.servers.append(proc)
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(proc, url)
        return url


class WalkError(AssertionError):
    pass


Step = Callable[[Walk, Found], None]


def skip(reason: str) -> tuple[str, Step | None]:
    return reason, None


def run(why: str, step: Step) -> tuple[str, Step | None]:
    return why, step


def readme_quickstart(walk: Walk, cmd: Found) -> None:
    install, _, command = cmd.text.partition(" && ")
    walk.sh(install)
    runs = walk.clone / "runs"  # `run`'s default runs root, in the clone where a user types it
    out = walk.sh(command, expect=(0, 1, 4))
    dirs = sorted(runs.iterdir())
    if len(dirs) != 1 or "run dir:" not in out.stderr:
        raise WalkError(f"`{command}` left {dirs} and said: {out.stderr[-2000:]}")
    walk.run_dir = dirs[0]
    walk.log("  " + "\n  ".join(out.stderr.strip().splitlines()[-24:]))


def readme_tests(walk: Walk, cmd: Found) -> None:
    install, _, pytest = cmd.text.partition(" && ")
    walk.sh(install)
    walk.sh(pytest.replace(" -q", " -q --collect-only"), timeout=900)


def probe_pair(walk: Walk, cmd: Found) -> None:
    """docs/probe.md's three lines: a fault's server, the good one, the drift probe."""
    if "DSV4BISECT_PATCHES=" in cmd.text:
        walk.env["WALK_FAULT_URL"] = walk.serve("mma-decode:merge-no-rescale", "--checkpoint",
                                                "random", "--device", "cpu")
    elif cmd.text.startswith("dsv4bisect serve"):
        walk.env["WALK_GOOD_URL"] = walk.serve("", "--checkpoint", "random", "--device", "cpu")
    else:
        line = cmd.text.replace("http://127.0.0.1:30001", walk.env["WALK_FAULT_URL"]).replace(
            "http://127.0.0.1:30000", walk.env["WALK_GOOD_URL"])
        walk.sh(f"{line} --out {walk.scratch / 'probe-drift'}", expect=(0, 1, 4),
                cwd=walk.scratch)


def commit_probe(walk: Walk, cmd: Found) -> None:
    """docs/bisect.md's SCRIPT line: the README run's directory as the baseline, against an
    embedded server of that run's good end (every patch off): a PASS, exit 0."""
    if walk.run_dir is None:
        raise WalkError("the README's `dsv4bisect run` did not leave a run directory")
    url = walk.serve_as(walk.run_dir / "baseline" / "config.json")  # as the SCRIPT says
    line = cmd.text.replace("http://127.0.0.1:30000", url).replace(" RUN ",
                                                                    f" {walk.run_dir} ")
    out = walk.sh(f"{line} --out {walk.scratch / 'probe-commit'}", cwd=walk.scratch)
    if not out.stderr.lstrip().splitlines() or "PASS" not in out.stderr:
        raise WalkError("the good end's own server did not PASS:\n" + out.stderr[-2000:])
    if "no A/A repeat" in out.stderr:
        raise WalkError("the run directory's A/A repeat was not used:\n" + out.stderr[-2000:])
    walk.log("  " + "\n  ".join(out.stderr.strip().splitlines()[-12:]))


def sglang_install(walk: Walk, cmd: Found) -> None:
    walk.sh(cmd.text.split("#")[0].replace("/path/to/dsv4bisect", str(walk.clone)))


def doctor_without_sglang(walk: Walk, cmd: Found) -> None:
    out = walk.sh(cmd.text.split("#")[0] + " --json", expect=(1,))
    if '"SGLang"' not in out.stdout or "install SGLang" not in out.stdout:
        raise WalkError(f"doctor did not say SGLang is missing: {out.stdout[-1000:]}")


def embedded_api(walk: Walk, cmd: Found) -> None:
    """docs/vllm.md's two lines: the embedded engine behind vLLM's API, a run and a bisect of a
    fault, each into the scratch runs root; the bisect must find the fault's patch."""
    out = walk.sh(f"{cmd.text} --out {walk.scratch / 'vllm-api'}", expect=(0, 1, 4),
                  cwd=walk.scratch)
    if " bisect " in cmd.text and "mma-decode" not in out.stdout + out.stderr.split("FOUND")[-1]:
        raise WalkError("the bisect over vLLM's API did not name mma-decode:\n"
                        + out.stderr[-2000:])


SYNOPSIS = skip("a synopsis (brackets, placeholders), not a command")
PLAN: dict[tuple[str, str], tuple[str, Step | None]] = {
    ("README.md", "pip install torch==2.13.0 -e '.[engine,plots]' && dsv4bisect run"):
        run("the quickstart, in the clone's venv; the run's output goes to a scratch runs root",
            readme_quickstart),
    ("README.md", "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"):
        skip("PyTorch's CPU index cannot be reached from here; the same wheel "
             "(torch-2.13.0+cpu) is installed from pip's local wheel directory"),
    ("README.md", "pip install torch==2.13.0 -e '.[kernels,test,plots]' && python -m pytest "
                  "-m \"not slow and not gpu\" -q"):
        run("the install as written; the suite collected, not run (CI runs it: .ci/run)",
            readme_tests),
    ("docs/probe.md", "DSV4BISECT_PATCHES=<variant> dsv4bisect serve --port 30001 --checkpoint "
                      "random [--moe-backend flashinfer_trtllm]"):
        run("with <variant> mma-decode:merge-no-rescale, on a free port", probe_pair),
    ("docs/probe.md", "dsv4bisect serve --port 30000 --checkpoint random"):
        run("on a free port", probe_pair),
    ("docs/probe.md", "dsv4bisect probe http://127.0.0.1:30001 --baseline http://127.0.0.1:30000 "
                      "--families drift --json"):
        run("against the two servers above", probe_pair),
    ("docs/bisect.md", "dsv4bisect probe http://127.0.0.1:30000 --baseline RUN --exit-policy "
                       "git-bisect"):
        run("RUN: the README run's directory; the server: an embedded good end", commit_probe),
    ("docs/bisect.md", "pip install -e python || exit 125            # a commit that does not "
                       "install: skip it"):
        skip("needs an SGLang clone"),
    ("docs/bisect.md", "python -m sglang.launch_server --model-path MODEL --port 30000 &    # as "
                       "RUN/baseline/config.json"):
        skip("needs SGLang and GPUs"),
    ("docs/sglang.md", "python -m sglang.launch_server --model-path … --tp 8 "
                       "--moe-runner-backend triton …"):
        skip("needs SGLang and GPUs"),
    ("docs/sglang.md", "pip install /path/to/dsv4bisect      # or: pip install -e "
                       "/path/to/dsv4bisect"):
        run("/path/to/dsv4bisect: the clone", sglang_install),
    ("docs/sglang.md", "dsv4bisect doctor dsv4-flash-tp8-latest  # SGLang release, plugin, every "
                       "hook target, flags, ports"):
        run("no SGLang here: it must exit 1 and say what to install", doctor_without_sglang),
    ("docs/run.md", "git bisect run dsv4bisect run deploy.yaml --exit-policy git-bisect --out "
                    "/tmp/runs"):
        skip("needs a profile's git history: tests/cli/test_exit_policy.py runs it on one (slow)"),
    ("docs/cluster.md", "ray start --head --port 6379 --resources '{\"dsv4_node\": 1}'          "
                        "      # the head"):
        skip("a multi-node Ray cluster: tests/bisect's Ray tests run a local one"),
    ("docs/cluster.md", "ray start --address HEAD:6379 --resources '{\"dsv4_node\": 1}'         "
                        "      # each other node"):
        skip("a multi-node Ray cluster"),
    ("docs/cluster.md", "dsv4bisect bisect mydeploy.yaml --executor ray --ray-address HEAD:6379 "
                        "--parallel 4"):
        skip("a multi-node Ray cluster and SGLang"),
    ("docs/kernels.md", "python tests/kernels/aot_check.py 90 120 --facts    # registers, spills, "
                        "wgmma, per kernel"):
        skip("needs a Hopper GPU (the coordinator's GPU session)"),
    ("docs/kernels.md", "python tests/benchmarks/kernels_bench.py --out OUT_DIR --tests-s 170 "
                        "--budget-s 430"):
        skip("needs a GPU"),
    ("docs/microtest.md", "dsv4bisect microtest --checkpoint /models/DeepSeek-V4-Flash-NVFP4 "
                          "--device cuda \\"):
        skip("needs the real checkpoint and a GPU"),
    ("docs/microtest.md", "dsv4bisect microtest hash-topk-scaling nvfp4-dispatch --checkpoint "
                          "/models/DeepSeek-V4-Flash-NVFP4 \\"):
        skip("needs the real checkpoint"),
    ("docs/microtest.md", "dsv4bisect microtest mhc-bf16 --checkpoint /models/DeepSeek-V4-Flash "
                          "--activations acts.safetensors"):
        skip("needs the real checkpoint and captured activations"),
}
PLAN.update({
    ("docs/reference-engine.md", "dsv4bisect router --pd-disaggregation --prefill http://H:PORT P "
                                 "--decode http://H:PORT --host H --port R --policy round_robin"):
        skip("a synopsis (H, PORT, P, R); tests/reference/test_pd_e2e.py starts the router "
             "between two embedded servers"),
    ("docs/vllm.md", "pip install /path/to/dsv4bisect                  # into the same Python as "
                     "vLLM"):
        run("/path/to/dsv4bisect: the clone", sglang_install),
    ("docs/vllm.md", "dsv4bisect doctor dsv4-flash-vllm-tp8            # vLLM release, plugin, "
                     "argv, every hook target"):
        skip("needs vLLM (tests/vllm/test_vllm_doctor.py checks it against vLLM's wheels)"),
    ("docs/vllm.md", "dsv4bisect switches --engine vllm                # vLLM's DeepSeek-V4 "
                     "switches (0.34.0)"):
        skip("reads vLLM's wheel (tests/vllm/test_vllm_switches.py)"),
    ("docs/vllm.md", "dsv4bisect run dsv4-flash-vllm-tp8-latest-all    # all patches on, "
                     "against all off"):
        skip("needs vLLM and GPUs"),
    ("docs/vllm.md", "dsv4bisect run reference-all --set engine.api=vllm"):
        run("the embedded engine behind vLLM's API", embedded_api),
    ("docs/vllm.md", "dsv4bisect bisect reference-all --set engine.api=vllm --set "
                     "patches.mma-decode.variant=swa-ring-stale"):
        run("the embedded engine behind vLLM's API; must name mma-decode", embedded_api),
})
QUICKSTART_CLUSTER = skip("docs/quickstart-cluster.md is walked by tests/docs/"
                          "test_quickstart_cluster.py (its own conventions)")


def plan_of(cmd: Found) -> tuple[str, Step | None] | None:
    if cmd.doc == "docs/quickstart-cluster.md":
        return QUICKSTART_CLUSTER
    known = PLAN.get((cmd.doc, cmd.text))
    if known is not None:
        return known
    if "[" in cmd.text and "]" in cmd.text or cmd.text.endswith("...") or " ...  " in cmd.text:
        return SYNOPSIS
    return None


# -- running ----------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(proc: subprocess.Popen[str], url: str, timeout: float = 300) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise WalkError(f"the server exited {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise WalkError(f"{url} did not become healthy")


def _clone(workdir: Path, log: Callable[[str], None]) -> tuple[Path, dict[str, str]]:
    # not `workdir/dsv4bisect`: a command run in workdir would import that folder (a
    # namespace package) instead of the installed one
    clone, venv = workdir / "clone", workdir / "venv"
    log(f"$ git clone {ROOT} {clone}")
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    env = {**os.environ, "VIRTUAL_ENV": str(venv), "NO_COLOR": "1",
           "PATH": f"{venv}/bin:{os.environ.get('PATH', '')}",
           "DSV4BISECT_CACHE": str(workdir / "cache")}
    env.pop("PYTHONPATH", None)
    return clone, env


def walk(workdir: Path, log: Callable[[str], None] = print) -> list[tuple[Found, str, str]]:
    """Run the plan; (command, `ran`/`skipped`, why) per command. Raises WalkError on the
    first command that fails or that the plan does not know."""
    found = found_commands()
    unknown = [c for c in found if plan_of(c) is None]
    stale = set(PLAN) - {(c.doc, c.text) for c in found}
    if stale:  # a command the plan runs or skips is no longer on its page
        raise WalkError("PLAN entries whose command is no longer in the docs:\n" + "\n".join(
            f"  {doc}: {text}" for doc, text in sorted(stale)))
    if unknown:
        raise WalkError("commands in the docs that tests/docs/walkthrough.py's PLAN does not "
                        "know (run them or skip them with a reason):\n" + "\n".join(
                            f"  {c.doc}:{c.line}: {c.text}" for c in unknown))
    clone, env = _clone(workdir, log)
    state = Walk(clone, workdir, env, log, [])
    report = []
    try:
        for cmd in found:
            why, step = plan_of(cmd) or ("", None)
            if step is None:
                report.append((cmd, "skipped", why))
                continue
            log(f"-- {cmd.doc}:{cmd.line}: {why}")
            step(state, cmd)
            report.append((cmd, "ran", why))
    finally:
        for proc in state.servers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
    return report


def _table(report: list[tuple[Found, str, str]]) -> Iterator[str]:
    for cmd, what, why in report:
        yield f"{what:<8} {cmd.doc}:{cmd.line}  {cmd.text[:70]}  ({why})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, help="where to clone (default: a temp dir)")
    parser.add_argument("--list", action="store_true", help="the plan, nothing run")
    args = parser.parse_args()
    if args.list:
        for cmd in found_commands():
            why, step = plan_of(cmd) or ("NOT IN THE PLAN", None)
            print(f"{'run' if step else 'skip':<5} {cmd.doc}:{cmd.line}  {cmd.text[:70]}  "
                  f"({why})")
        return 0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dsv4bisect-walk-"))
    try:
        report = walk(workdir)
    except WalkError as exc:
        print(f"walk-through failed: {exc}", file=sys.stderr)
        return 1
    print("\n".join(_table(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
