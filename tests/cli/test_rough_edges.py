"""The rough edges a newcomer hit (issue 16, item 3), one test each: the command as the user
types it (in-process through `dsv4bisect.cli.main`, or a quick subprocess where a pipe or a
terminal matters)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4bisect.config.resolve import Overrides, resolve

ROOT = Path(__file__).parents[2]
CHECK = ROOT / "tests" / "bisect" / "fake_check.py"


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run `dsv4bisect ARGS` in this process: (exit code, stdout, stderr)."""
    from dsv4bisect.cli import main

    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out = capsys.readouterr()
    return int(exc.value.code or 0), out.out, out.err


def fingerprint_of(stdout: str) -> str:
    m = re.search(r"fingerprint ([0-9a-f]{16})", stdout)
    assert m, stdout
    return m.group(1)


# -- profile new --from -------------------------------------------------------------------------
@pytest.mark.parametrize("base", ["dsv4-flash-tp8", "reference-all"])
def test_profile_new_from_inherits_the_base(base: str, tmp_path: Path, monkeypatch,
                                            capsys) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(capsys, "profile", "new", "mine", "--from", base)
    assert code == 0, err
    text = (tmp_path / "mine.yaml").read_text()
    code, out, err = cli(capsys, "profile", "validate", "mine.yaml")
    assert code == 0 and "cannot start" not in out, out + err
    assert fingerprint_of(out) == resolve(base).fingerprint  # the same experiment as the base
    if base == "reference-all":
        assert fingerprint_of(out) != resolve("reference").fingerprint
    # the starter's own comment is a command that works as written
    shown = re.search(r"#\s+(dsv4bisect profile show .*)", text)
    assert shown and shown.group(1).split() == ["dsv4bisect", "profile", "show", "mine.yaml",
                                                "--resolved", "--why"]
    code, out, err = cli(capsys, *shown.group(1).split()[1:])
    assert code == 0 and "# where each value comes from" in out, err
    # the inherited values are commented YAML: uncommenting a section changes the experiment
    inherited = re.search(r"#   mma-decode: (\w+)", text)
    assert inherited and inherited.group(1) == ("true" if base == "reference-all" else "false")
    flip = "false" if inherited.group(1) == "true" else "true"
    edited = text.replace("# patches:", "patches:").replace(inherited.group(0),
                                                            f"  mma-decode: {flip}")
    (tmp_path / "mine.yaml").write_text(edited)
    code, out, err = cli(capsys, "profile", "validate", "mine.yaml")
    assert code == 0, err
    flipped = Overrides(enable=("mma-decode",)) if flip == "true" else \
        Overrides(disable=("mma-decode",))
    assert fingerprint_of(out) == resolve(base, flipped).fingerprint


def test_profile_new_from_a_file_writes_extends_relative_to_the_new_file(
        tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli(capsys, "profile", "new", "child", "--from", "reference-all")[0] == 0
    code, _, err = cli(capsys, "profile", "new", "grand", "--from", "child.yaml",
                       "--output", "sub/dir/grand.yaml")
    assert code == 0, err
    assert "extends: ../../child.yaml" in (tmp_path / "sub/dir/grand.yaml").read_text()
    code, out, _ = cli(capsys, "profile", "validate", "sub/dir/grand.yaml")
    assert code == 0 and fingerprint_of(out) == resolve("reference-all").fingerprint


# -- errors name the flag or the argument -------------------------------------------------------
@pytest.mark.parametrize(("item", "expected"), [
    ("foo=1", "error: --set foo=1: unknown key `foo`"),
    ("foo.bar=1", "error: --set foo.bar=1: unknown key `foo`"),
    ("engin.tp=2", "error: --set engin.tp=2: unknown key `engin`; did you mean `engine`?"),
    ("engine.tpp=1", "error: --set engine.tpp=1: unknown key `tpp`; did you mean `tp`?"),
])
def test_an_unknown_set_key_is_blamed_on_the_flag(item: str, expected: str, capsys) -> None:
    code, _, err = cli(capsys, "profile", "show", "reference", "--set", item)
    assert code == 5 and err.splitlines()[0] == expected, err
    assert "builtin:" not in err


def test_microtest_names_the_argument_not_the_env_var(capsys) -> None:
    code, _, err = cli(capsys, "microtest", "mma-decod")
    assert code == 5, err
    first, hint = err.strip().splitlines()
    assert first == "error: microtest argument `mma-decod`: unknown patch `mma-decod`"
    assert "DSV4BISECT_PATCHES" not in err and "did you mean `mma-decode`?" in hint


# -- doctor on an embedded-engine profile -------------------------------------------------------
def test_doctor_checks_the_embedded_engine_not_sglang(tmp_path: Path, capsys) -> None:
    code, out, err = cli(capsys, "doctor", "reference-all", "--json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert code == 0, out + err
    assert list(rows) == ["engine Python", "torch", "checkpoint embedded"]
    assert rows["engine Python"]["detail"].startswith(sys.executable)  # {python} substituted
    assert "{python}" not in out and "SGLang" not in out
    assert "every tensor loaded" in rows["checkpoint embedded"]["detail"]
    # --set works on doctor, and a checkpoint that is not there fails its row
    code, out, _ = cli(capsys, "doctor", "reference", "--json",
                       "--set", f"engine.reference.checkpoint={tmp_path}")
    rows = {r["name"]: r for r in json.loads(out)}
    assert code == 1 and rows[f"checkpoint {tmp_path}"]["status"] == "fail"
    assert "no config.json" in rows[f"checkpoint {tmp_path}"]["detail"]


# -- the override options on every command that takes a profile --------------------------------
def test_override_options_work_on_every_profile_command(capsys) -> None:
    enabled = resolve("reference", Overrides(enable=("mma-decode",)))
    code, out, err = cli(capsys, "profile", "validate", "reference", "--enable", "mma-decode")
    assert code == 0 and fingerprint_of(out) == enabled.fingerprint, err
    code, out, err = cli(capsys, "patches", "list", "--profile", "reference", "--only",
                         "mma-decode", "--json")
    assert code == 0, err
    assert [r["name"] for r in json.loads(out) if r["enabled"]] == ["mma-decode"]
    code, out, err = cli(capsys, "diff-config", "reference", "reference", "--enable",
                         "mma-decode", "--json")
    diff = json.loads(out)
    assert code == 1 and diff["b"]["fingerprint"] == enabled.fingerprint, err
    assert {"section": "patches", "key": "mma-decode", "a": "off", "b": "split-k"} \
        in diff["changes"]
    code, _, err = cli(capsys, "patches", "list", "--enable", "mma-decode")
    assert code == 5 and "need --profile" in err  # no profile: said so, not ignored
    readme = (ROOT / "README.md").read_text()
    sentence = readme[readme.index("The override options"):][:600]
    for command in ("run", "bisect", "profile show", "profile validate", "patches list",
                    "diff-config", "doctor"):
        assert f"`{command}" in sentence, command


# -- diff-config across process roles -----------------------------------------------------------
def test_diff_config_compares_across_roles_when_the_layouts_differ(capsys) -> None:
    code, out, _ = cli(capsys, "diff-config", "dsv4-flash-tp8", "dsv4-flash-pd8", "--json")
    changes = {(c["section"], c["key"]): (c["a"], c["b"]) for c in json.loads(out)["changes"]}
    assert code == 1
    assert changes[("processes", "server")] == (True, False)
    assert changes[("process:server→prefill", "--tp")] == ("8", "4")
    assert changes[("process:server→decode", "(gpus)")] == ("0,1,2,3,4,5,6,7", "4,5,6,7")
    assert changes[("process:server→decode", "--disaggregation-mode")] == ("(absent)", "decode")
    assert ("process:server→prefill", "--port") not in changes  # its own port token: no change


# -- no hard wrap off a terminal ----------------------------------------------------------------
def test_no_hard_wrap_when_piped() -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # COLUMNS, if set, wins
    listing = subprocess.run([sys.executable, "-m", "dsv4bisect", "patches", "list", "--profile",
                              "reference-all"], capture_output=True, text=True, check=True,
                             env=env)
    clamp = next(line for line in listing.stdout.splitlines() if "trtllm-clamp" in line)
    assert "inert: the MoE runner backend is not flashinfer TRT-LLM, so the clamp site is " \
           "never reached" in clamp  # one row, one line
    code = ("from rich.table import Table; from dsv4bisect.ui.console import console; "
            "t = Table(); t.add_column('note'); t.add_row('x' * 300); console().print(t)")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env).stderr
    assert "x" * 300 in err  # the stderr console (microtest, report) too


def test_a_terminal_keeps_its_width() -> None:
    from dsv4bisect.ui.console import UNWRAPPED, _width

    leader, follower = os.openpty()
    try:
        with open(follower, "w", closefd=False) as tty:
            assert _width(tty) is None  # Rich measures the terminal
        with open(os.devnull, "w") as pipe:
            assert _width(pipe) == UNWRAPPED
    finally:
        os.close(leader)
        os.close(follower)


# -- probe names the candidate ------------------------------------------------------------------
def test_probe_verdict_line_names_the_candidate(tmp_path: Path, capsys) -> None:
    import random

    from dsv4bisect.cli.probe import _summary
    from dsv4bisect.probe import formats
    from dsv4bisect.probe.grid import Case, Cell
    from dsv4bisect.probe.run import ProbeRun
    from dsv4bisect.probe.runner import judge
    from dsv4bisect.probe.session import ProbeSession
    from dsv4bisect.probe.spec import tier_spec
    from dsv4bisect.probe.vocab import PROBE_VOCAB

    c = formats.needle_content(random.Random(1), PROBE_VOCAB, 0.5, distractors=1)
    case = Case("needle/L256/d0.5/t2/0", Cell("needle", 256, 0.5, 2), 0, 1, 256,
                ({"role": "user", "content": c.question},), 256, c.expected, c.values, 0.5, 9)
    base = ProbeRun(tier_spec("ci"), "http://127.0.0.1:30001", {}, (case,), ())
    cand = ProbeRun(tier_spec("ci"), "http://127.0.0.1:30002", {}, (case,), ())
    verdict = judge(base, None, cand)
    _summary(verdict, ProbeSession(base, None, cand, verdict, tmp_path))
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith(f"{verdict.verdict}  http://127.0.0.1:30002 (ci tier"), first


# -- bisect: the remedy hint is a whole command; remedy trials say so ---------------------------
def test_remedy_hint_is_a_command_to_copy_and_remedy_trials_are_labelled(cli, tmp_path: Path
                                                                         ) -> None:
    log = tmp_path / "calls.log"
    # one culprit alone and one pair: the pair's patches pass alone, so the bad end still fails
    # without whichever the search names first (two that each fail alone are named together)
    check = f"{sys.executable} {CHECK} {log} 'hash-topk-scaling|mma-decode,nvfp4-dispatch'"
    r = cli("bisect", "--test-cmd", check, "--false-fail", "0", "--false-pass", "0",
            "--json", "--out", "runs", cwd=tmp_path)
    report = json.loads(r.stdout)
    assert report["remedy"]["verdict"] == "fails", r.stderr
    remedy_steps = [line for line in r.stderr.splitlines()
                    if line.startswith("remedy trial (step") and " -> " in line]
    assert len(remedy_steps) == report["remedy"]["trials_run"] >= 1, r.stderr
    numbers = [re.match(r"remedy trial \(step (\d+)\)", line).group(1) for line in remedy_steps]
    assert not any(line.startswith((f"step {n}:", f"trial {n}:")) for n in numbers
                   for line in r.stderr.splitlines())  # never shown as a search step
    advice = next(line for line in r.stderr.splitlines() if "still fails without" in line)
    command = re.search(r"`(dsv4bisect bisect [^`]+)`", advice)
    assert command, advice
    argv = shlex.split(command.group(1))
    assert "--json" not in argv and argv.count("--candidates") == 1
    again = cli(*argv[1:], "--json", cwd=tmp_path)  # as written (plus --json to read the result)
    first = report["culprits"]
    assert again.returncode == 0, again.stderr
    held = advice.split("still fails without {")[1].split("}")[0].split(", ")
    assert sorted(held) == sorted(set(report["settings"]["candidates"]) - set(report["remedy"]["subset"]))
    groups = ({"hash-topk-scaling"}, {"mma-decode", "nvfp4-dispatch"})
    assert set(json.loads(again.stdout)["culprits"] or ()) in groups, again.stderr
    assert first is None or set(first) in groups


# -- progress labels ----------------------------------------------------------------------------
def test_progress_lines_are_labelled(capsys) -> None:
    from dsv4bisect.cli.run import RunDisplay
    from dsv4bisect.probe.runner import ProbeProgress
    from dsv4bisect.run.events import EngineEvent, Notice, ProbeEvent

    display = RunDisplay()  # off a terminal: one plain line per change
    ready = ("ready: dsv4bisect reference engine on http://127.0.0.1:4242 (model "
             "/long/path/dsv4bisect/reference/weights, device cpu, patches none)")
    display(EngineEvent("baseline", 1, "server", "ready", ready))
    display(ProbeEvent("baseline", ProbeProgress("build", 40, 40, 0.0, 0, 0)))
    display(ProbeEvent("baseline", ProbeProgress("probe", 40, 40, 900.0, 30, 36)))
    display(Notice("A/A repeat subset (smoke tier): every drift transcript and the 18 of 36 "
                   "accuracy cases at lengths [1024, 2048]"))
    display(ProbeEvent("A/A repeat", ProbeProgress("probe", 22, 22, 900.0, 17, 18)))
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == ("baseline server: ready - dsv4bisect reference engine on "
                        "http://127.0.0.1:4242 (model /long/path/dsv4bisect/reference/weights, "
                        "device cpu, patches none)")
    assert lines[1] == "baseline prompts: 40/40"
    assert lines[2] == "baseline requests: 40/40 900 tok/s acc 83%"
    assert lines[3].startswith("A/A repeat subset") and "18 of 36" in lines[3]
    assert lines[4] == "A/A repeat requests: 22/22 900 tok/s acc 94%"


# -- docs brought true --------------------------------------------------------------------------
def test_docs_nvfp4_dispatch_inert_statement_matches_the_tool() -> None:
    row = next(line for line in (ROOT / "docs" / "patches.md").read_text().splitlines()
               if line.startswith("| `nvfp4-dispatch`"))
    assert "inert on SGLang ≥ 0.5.13" in row and "acts on the embedded engine" in row
    for profile in ("dsv4-flash-tp8-all", "dsv4-flash-tp8-latest-all"):  # 0.5.13 and 0.5.23
        choice = next(c for c in resolve(profile).available if c.name == "nvfp4-dispatch")
        assert choice.inert, profile
    choice = next(c for c in resolve("reference-all").available if c.name == "nvfp4-dispatch")
    assert choice.inert is None


def test_docs_run_receipts_paragraph_is_current() -> None:
    text = (ROOT / "docs" / "run.md").read_text()
    assert "LEAD:" not in text and "module is absent" not in text
    assert (ROOT / "dsv4bisect" / "engines" / "receipts.py").is_file()
    assert "check_receipts(" in (ROOT / "dsv4bisect" / "run" / "arm.py").read_text()


def test_readme_says_patches_list_shows_conditions_with_profile() -> None:
    row = next(line for line in (ROOT / "README.md").read_text().splitlines()
               if line.startswith("| `patches list"))
    assert "with `--profile`" in row and "inert" in row
