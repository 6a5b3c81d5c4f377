"""No secret in any output: a property over every env and argv position of every shipped profile.

Each example extends a shipped profile and plants a distinct secret in every place a profile can
carry one: a secret-named env var (`*_TOKEN`, `*KEY*`, `*SECRET*`, ...) in the engine's env, in
each PD role's env (prefill, decode, router) and in a custom patch's env; a `--api-key VALUE` /
`--hf-token=VALUE` flag in the engine's args, each PD role's args and a custom patch's args; and
a `--set engine.env.NAME=VALUE` on the command line. No value may appear in any output of
`profile show` (every format), `profile validate`, `diff-config` (both directions, text and
JSON), or `report` on a run directory holding that configuration (terminal, JSON, markdown).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cli_inproc import cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsv4bisect.config.layering import builtin_names
from dsv4bisect.config.resolve import Overrides, resolve
from dsv4bisect.probe.verdict import Verdict

MARKERS = ["_TOKEN", "_API_KEY", "KEY", "_SECRET", "SECRET_", "_PASSWORD", "ACCESS_KEY_"]
FLAGS = ["--api-key", "--hf-token", "--secret", "--auth-token", "--access-key"]

names = st.builds(lambda pre, marker, post: f"{pre}{marker}{post}",
                  st.from_regex(r"[A-Z]{1,6}", fullmatch=True), st.sampled_from(MARKERS),
                  st.from_regex(r"[A-Z0-9]{0,4}", fullmatch=True))
# A recognisable prefix keeps a value from matching ordinary output by chance.
values = st.from_regex(r"[A-Za-z0-9_\-]{8,20}", fullmatch=True).map(lambda v: "sk-" + v)
flags = st.tuples(st.sampled_from(FLAGS), st.booleans())  # (flag, joined with `=`)


def _args(flag: tuple[str, bool], value: str) -> list[str]:
    name, joined = flag
    return ["--log-level", "info", f"{name}={value}"] if joined else [name, value, "--x", "1"]


def _plant(base: str, draw_name, draw_value, draw_flag) -> tuple[dict, list[str], str]:  # noqa: ANN001
    """A profile extending `base` with a secret in every env/argv position; its secrets."""
    secrets: list[str] = []

    def env() -> dict[str, str]:
        value = draw_value()
        secrets.append(value)
        return {draw_name(): value, "PLAIN_SETTING": "1"}

    def args() -> list[str]:
        value = draw_value()
        secrets.append(value)
        return _args(draw_flag(), value)

    engine: dict = {"env": env(), "args": args()}
    if resolve(base).entry_role == "router":  # PD: each role has its own env and args
        pd = {"prefill": {"env": env(), "args": args()}, "decode": {"env": env(), "args": args()},
              "router": {"env": env(), "args": args()}}
        engine["pd"] = pd
    profile = {"schema_version": 1, "name": "planted", "extends": base, "engine": engine,
               "custom_patches": {"my-flag": {"summary": "ours", "env": env(), "args": args()}},
               "patches": {"my-flag": True}}
    set_value = draw_value()
    secrets.append(set_value)
    return profile, secrets, f"engine.env.{draw_name()}={set_value}"


def _run_dir(root: Path, profile: Path, set_flag: str) -> Path:
    """A run directory as `dsv4bisect run` leaves it: unredacted configs, the request's --set."""
    run = root / "run"
    for arm, ov in (("baseline", Overrides(sets=(set_flag,), only=())),
                    ("candidate", Overrides(sets=(set_flag,)))):
        (run / arm).mkdir(parents=True)
        cfg = resolve(str(profile), ov)
        (run / arm / "config.json").write_text(json.dumps(cfg.to_json(redact=False)))
    (run / "run.json").write_text(json.dumps({
        "schema": "dsv4bisect.run/1", "status": "done", "profile": str(profile), "tier": "ci",
        "overrides": {"sets": [set_flag], "enable": [], "disable": [], "only": None},
        "error": None}))
    (run / "verdict.json").write_text(json.dumps(
        Verdict("FAIL", (f"candidate failed with --set {set_flag}",), {"tier": "ci"}).to_dict()))
    return run


def _outputs(path: Path, base: str, set_flag: str, run: Path) -> list[tuple[tuple[str, ...], str]]:
    p = str(path)
    commands = [
        ("profile", "show", p), ("profile", "show", p, "--json"), ("profile", "show", p, "--why"),
        ("profile", "show", p, "--resolved"), ("profile", "show", p, "--resolved", "--json"),
        ("profile", "show", p, "--resolved", "--why"),
        ("profile", "show", p, "--resolved", "--json", "--why"),
        ("profile", "show", p, "--resolved", "--why", "--set", set_flag),
        ("profile", "show", p, "--why", "--set", set_flag),
        ("profile", "validate", p),
        ("diff-config", p, base), ("diff-config", base, p, "--json"),
        ("diff-config", str(run), base), ("diff-config", base, str(run), "--json"),
        ("report", str(run)), ("report", str(run), "--json"), ("report", str(run), "--format", "md"),
    ]
    out = []
    for command in commands:
        result = cli(*command)
        result.assert_clean()
        assert result.code in (0, 1), (command, result.err[-400:])
        out.append((command, result.out + result.err))
    return out


@pytest.mark.parametrize("base", builtin_names())
@settings(max_examples=3, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_planted_secret_appears_in_no_output(base: str, data: st.DataObject,
                                               tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("planted")
    profile, secrets, set_flag = _plant(base, lambda: data.draw(names),
                                        lambda: data.draw(values), lambda: data.draw(flags))
    path = root / "planted.yaml"
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    run = _run_dir(root, path, set_flag)
    for command, text in _outputs(path, base, set_flag, run):
        for secret in secrets:
            assert secret not in text, f"{secret} printed by `dsv4bisect {' '.join(command)}`"
    # The run directory's report.md is an output too, rendered by the same function.
    from dsv4bisect.report.run_report import load_run, render_markdown

    markdown = render_markdown(load_run(run))
    assert not [s for s in secrets if s in markdown]


def test_the_identity_of_a_resolved_config_is_redacted() -> None:
    """The case issue 15 found: `--resolved --json` printed env and argv under `identity`."""
    result = cli("profile", "show", "dsv4-flash-tp8", "--resolved", "--json",
                 "--set", "engine.env.HF_TOKEN=tok-AAAA-1111",
                 "--set", "engine.args=[--api-key, tok-BBBB-2222]")
    result.assert_clean()
    data = json.loads(result.out)
    assert "tok-AAAA" not in result.out and "tok-BBBB" not in result.out
    assert data["identity"]["processes"][0]["env"]["HF_TOKEN"] == "***"
    # Redaction is for output only: the fingerprint still covers the real values.
    other = cli("profile", "show", "dsv4-flash-tp8", "--resolved", "--json",
                "--set", "engine.env.HF_TOKEN=tok-CCCC-3333",
                "--set", "engine.args=[--api-key, tok-BBBB-2222]")
    assert json.loads(other.out)["fingerprint"] != data["fingerprint"]


def test_redaction_keeps_what_is_not_a_secret() -> None:
    """Over-redaction would hide what a user needs: counts, diff keys, env var *names*."""
    from dsv4bisect.redact import redact

    data = {"key": "--api-key", "prompt_tokens": "12", "api_key_env": "SGLANG_API_KEY",
            "argv": ["--port", "30000", "--api-key", "sk-abcdefgh"],
            "note": "started with HF_TOKEN=hf-abcdefgh and --tp 8"}
    out = redact(data)
    assert out["key"] == "--api-key" and out["prompt_tokens"] == "12"
    assert out["api_key_env"] == "SGLANG_API_KEY"
    assert out["argv"] == ["--port", "30000", "--api-key", "***"]
    assert out["note"] == "started with HF_TOKEN=*** and --tp 8"
