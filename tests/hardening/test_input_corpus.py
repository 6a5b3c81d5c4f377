"""The fuzz corpus as fast tests: every command that reads user input answers within 20 s, with
no traceback and a documented exit code (never 70), and bad input is `error:` + `hint:`.

Cases come from issue 15's findings and tests/benchmarks/fuzz_profiles.py's mutation classes.
Every command runs through the real entry point in-process (cli_inproc.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_inproc import cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsv4bisect.probe.verdict import Verdict

HEAD = "schema_version: 1\nname: mutant\nextends: reference-all\n"


def _bomb() -> str:
    lines = ['l0: &l0 "lol"'] + [f"l{n}: &l{n} [{','.join([f'*l{n - 1}'] * 9)}]"
                                 for n in range(1, 12)]
    return "\n".join(lines) + "\n" + HEAD + "description: *l11\n"


PROFILE_CASES: dict[str, bytes] = {
    "deep-flow": (HEAD + "description: " + "[" * 600 + "]" * 600 + "\n").encode(),
    "deep-map": (HEAD + "engine: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n").encode(),
    "recursive-alias": (HEAD + "rec: &r [*r]\n").encode(),
    "alias-bomb": _bomb().encode(),
    "utf16": HEAD.encode("utf-16"),
    "latin1": (HEAD + "description: caf\xe9\n").encode("latin-1"),
    "nul": HEAD.encode() + b"description: a\x00b\n",
    "binary": bytes(range(256)) * 8,
    "control-char": (HEAD + "description: a\x1bb\n").encode(),
    "extends-environ": b"schema_version: 1\nname: m\nextends: /proc/self/environ\n",
    "extends-dev-zero": b"schema_version: 1\nname: m\nextends: /dev/zero\n",
    "extends-etc": b"schema_version: 1\nname: m\nextends: /etc\n",
    "extends-long-name": ("schema_version: 1\nname: m\nextends: " + "x" * 5000 + "\n").encode(),
    "extends-nul": b'schema_version: 1\nname: m\nextends: "ref\\0erence"\n',
    "extends-self": b"schema_version: 1\nname: m\nextends: p.yaml\n",
    "env-key-equals": (HEAD + 'engine: {env: {"A=B": "1"}}\n').encode(),
    "env-key-nul": (HEAD + 'engine: {env: {"A\\0B": "1"}}\n').encode(),
    "env-value-nul": (HEAD + 'engine: {env: {A: "x\\0y"}}\n').encode(),
    "env-bool": (HEAD + "engine: {env: {A: true}}\n").encode(),
    "args-nul": (HEAD + 'engine: {args: ["a\\0b"]}\n').encode(),
    "args-mapping": (HEAD + "engine: {args: {a: b}}\n").encode(),
    "host-nul": (HEAD + 'engine: {host: "127.0.0.1\\0"}\n').encode(),
    "huge-int": (HEAD + "engine: {tp: " + "9" * 5000 + "}\n").encode(),
    "parallel-1e28": (HEAD + "bisect: {parallel: 1.0e+28}\n").encode(),
    "parallel-huge": (HEAD + "bisect: {parallel: 100000}\n").encode(),
    "threads-1e28": (HEAD + "engine: {reference: {threads: 1.0e+28}}\n").encode(),
    "max-model-len-1e28": (HEAD + "engine: {reference: {max_model_len: 1.0e+28}}\n").encode(),
    "lengths-1e10": (HEAD + "probe: {lengths: [10000000000]}\n").encode(),
    "timeout-inf": (HEAD + "engine: {startup_timeout_s: .inf}\n").encode(),
    "timeout-nan": (HEAD + "probe: {request_timeout_s: .nan}\n").encode(),
    "prior-inf": (HEAD + "bisect: {priors: {mhc-bf16: .inf}}\n").encode(),
    "port-0": (HEAD + "engine: {port: 0}\n").encode(),
    "truncated": HEAD.encode()[:30],
    "list-top": b"- a\n- b\n",
    "scalar-top": b"42\n",
    "two-docs": (HEAD + "---\nb: 1\n").encode(),
    "python-tag": (HEAD + "x: !!python/object/apply:os.system [ls]\n").encode(),
    "bad-date": (HEAD + "description: 2001-13-45\n").encode(),
    "many-keys": (HEAD + "patches2:\n" + "".join(f"  p{i}: 1\n" for i in range(6000))).encode(),
}

PROFILE_COMMANDS = [
    ("profile", "validate", "{p}"),
    ("profile", "show", "{p}"),
    ("profile", "show", "{p}", "--resolved", "--json", "--why"),
    ("diff-config", "{p}", "reference"),
    ("bisect", "{p}", "--plan"),
    ("run", "{p}"),  # every case fails validation, so nothing is ever launched
]


@pytest.mark.parametrize("case", sorted(PROFILE_CASES))
def test_every_profile_command_refuses_a_hostile_profile(case: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.yaml").write_bytes(PROFILE_CASES[case])
    for command in PROFILE_COMMANDS:
        result = cli(*[a.replace("{p}", "p.yaml") for a in command])
        result.assert_error()
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_long_extends_chain_is_refused(tmp_path: Path) -> None:
    for i in range(300):
        (tmp_path / f"c{i}.yaml").write_text(f"schema_version: 1\nname: c{i}\n"
                                             f"extends: c{i + 1}.yaml\n")
    (tmp_path / "c300.yaml").write_text(HEAD)
    result = cli("profile", "show", str(tmp_path / "c0.yaml"), "--resolved")
    result.assert_error()
    assert "chain longer than" in result.err


@pytest.mark.parametrize("args", [
    ("profile", "show", "reference", "--set", "engine.args=" + "[" * 5000 + "]" * 5000),
    ("profile", "show", "reference", "--set", "engine.args=" + "[" * 5000),
    ("profile", "show", "reference", "--set", "a.b.c.d.e.f.g.h.i.j.k=1"),
    ("profile", "show", "reference", "--set", "engine.tp=&a 1"),
    ("profile", "show", "reference", "--set", "engine.tp=" + "9" * 5000),
    ("profile", "show", "reference", "--set", "engine.reference.threads=1.0e+28"),
    ("profile", "validate", "/proc/self/environ"),
    ("profile", "validate", "/dev/zero"),
    ("profile", "validate", "/etc/passwd"),
    ("profile", "new", "../../etc/x"),
    ("profile", "new", "a/b"),
    ("profile", "new", ""),
    ("bisect", "--parallel", "100000", "--plan"),
    ("bisect", "--plan", "--set", "bisect.parallel=1e28"),
    ("bisect", "--plan", "--set", "bisect.parallel=1.0e+28"),
    ("bisect", "--plan", "--launch-cost", "-1"),
    ("bisect", "--plan", "--launch-cost", "nan"),
    ("bisect", "--plan", "--launch-cost", "inf"),
    ("bisect", "--plan", "--probe-cost", "1e400"),
    ("bisect", "--plan", "--false-fail", "nan"),
    ("bisect", "--plan", "--confidence", "inf"),
    ("bisect", "--plan", "--json", "--format", "md"),
    ("run", "--json", "--format", "md"),
    ("run", "--only", ",,,"),
    ("run", "--only", " , "),
    ("report", "/etc/passwd"),
    ("report", "/nonexistent/dir"),
    ("diff-config", "/etc/passwd", "reference"),
    ("diff-config", "x" * 5000, "reference"),  # ENAMETOOLONG from the OS
    ("report", "x" * 5000),
    ("profile", "validate", "x" * 5000),
    ("profile", "show", "reference", "--only", "mhc-bf16,nope"),
])
def test_hostile_arguments_are_one_line_errors(args: tuple[str, ...], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = cli(*args)
    result.assert_error()
    assert not (tmp_path / "runs").exists(), "an error must not leave a run directory"
    assert not any(tmp_path.rglob("*.yaml")), "profile new wrote a file for a bad name"


# -- run directories of the wrong shape ---------------------------------------------------------
def _run_dir(root: Path) -> Path:
    run = root / "run"
    (run / "candidate").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"schema": "dsv4bisect.run/1", "status": "done",
                                              "profile": "reference-all"}))
    (run / "verdict.json").write_text(json.dumps(Verdict("PASS", ("fine",), {"tier": "ci"})
                                                 .to_dict()))
    return run


def test_a_well_formed_run_directory_reports_in_every_format(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    for flags in ((), ("--json",), ("--format", "md")):
        result = cli("report", str(run), *flags)
        result.assert_clean()
        assert result.code == 0 and "PASS" in result.out + result.err


BROKEN_FILES = {
    "run.json": ["[]", "", '{"schema": "dsv4bisect.run/1"', '{"schema": 5}', "null",
                 '{"schema": "dsv4bisect.run/1", "arms": []}',
                 '{"schema": "dsv4bisect.run/1", "status": 7}',
                 '{"schema": "dsv4bisect.run/1", "arms": {"baseline": 3}}',
                 '{"schema": "dsv4bisect.run/1", "wall_s": "long"}',
                 '{"schema": "dsv4bisect.run/1", "error": "boom"}',
                 '{"schema": "dsv4bisect.run/1", "overrides": {"sets": 5}}',
                 "[" * 100000],
    "verdict.json": ["[]", "{", '{"schema": "dsv4bisect.verdict/1"}', "true",
                     '{"schema": "dsv4bisect.verdict/1", "verdict": "MAYBE", "reasons": [],'
                     ' "probe": {}}',
                     '{"schema": "dsv4bisect.verdict/1", "verdict": "PASS", "reasons": [1],'
                     ' "probe": {}}',
                     '{"schema": "dsv4bisect.verdict/1", "verdict": "PASS", "reasons": [],'
                     ' "probe": {}, "families": {"needle": {"n": "x"}}}',
                     '{"schema": "dsv4bisect.verdict/1", "verdict": "PASS", "reasons": [],'
                     ' "probe": {}, "drift": {"candidate": {"kl_mean": "x"}}}'],
    "candidate/config.json": ["[]", "{", "7"],
}


@pytest.mark.parametrize("name, text", [(n, t) for n, ts in BROKEN_FILES.items() for t in ts])
def test_report_on_a_broken_run_directory_is_an_error_with_a_hint(tmp_path: Path, name: str,
                                                                  text: str) -> None:
    run = _run_dir(tmp_path)
    (run / name).write_text(text)
    for flags in ((), ("--json",), ("--format", "md")):
        result = cli("report", str(run), *flags)
        result.assert_clean()
        if result.code != 0:  # a field the chosen format does not read may pass
            result.assert_error()


def test_report_of_a_bisect_dir_with_a_broken_run_file_is_an_error(tmp_path: Path) -> None:
    for text in ("[]", '{"run_id": 5, "ledger": []}', "{"):
        (tmp_path / "bisect.json").write_text(text)
        result = cli("report", str(tmp_path))
        result.assert_error()
    assert not (tmp_path / "ledger.sqlite").exists()


# -- every numeric field has a range ------------------------------------------------------------
NUMERIC = ["engine.tp", "engine.dp", "engine.port", "engine.chunked_prefill_size",
           "engine.startup_timeout_s", "engine.reference.threads",
           "engine.reference.max_model_len", "probe.request_timeout_s",
           "bisect.parallel", "bisect.max_trials", "bisect.confidence", "engine.gpus",
           "probe.lengths", "probe.depths"]
OUT_OF_RANGE = st.one_of(
    st.sampled_from(["1e28", "1.0e+28", "-1", ".nan", ".inf", "-.inf", "1e400", "10000000000",
                     "0x7fffffffffffffffff", "9" * 80]),
    st.integers(min_value=1 << 25, max_value=1 << 80).map(str),
    st.integers(max_value=-1).map(str),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(NUMERIC), value=OUT_OF_RANGE)
def test_out_of_range_numbers_are_refused_at_validation(key: str, value: str) -> None:
    if key in ("engine.gpus", "probe.lengths", "probe.depths"):
        value = f"[{value}]"
    result = cli("profile", "show", "reference", "--set", f"{key}={value}")
    result.assert_error()


def test_a_seed_beyond_64_bits_is_refused() -> None:
    cli("profile", "show", "reference", "--set", f"probe.seed={1 << 63}").assert_error()
