"""The secret rule as documented (docs/profiles.md § Secrets in output), plurals included, and
credentials in URLs — everywhere a value is written, run records included (issue 30, item 7).
Counts are not secrets: `--max-total-tokens 4096`, `prompt_tokens`, any plain number."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_inproc import cli

from dsv4bisect.config.resolve import Overrides, resolve
from dsv4bisect.probe.spec import tier_spec
from dsv4bisect.redact import is_secret_key, redact, redact_argv, redact_text
from dsv4bisect.run.record import RunRecord

NAMES = ["HF_TOKENS", "KEYS", "GITHUB_TOKENS_FILE", "AUTH", "SESSION_COOKIE", "BASIC_AUTH",
         "API_SECRETS", "DB_PASSWORDS", "AWS_CREDENTIALS", "PROXY_AUTHORIZATION"]


@pytest.mark.parametrize("name", NAMES)
def test_profile_show_resolved_hides_every_documented_name(name: str) -> None:
    value = f"val-{name.lower()}-9f8e7d"
    for fmt in ((), ("--json",)):
        result = cli("profile", "show", "reference", "--resolved", *fmt,
                     "--set", f"engine.env.{name}={value}")
        result.assert_clean()
        assert result.code == 0 and value not in result.out + result.err, (name, fmt)
        assert name in result.out  # the name itself is shown


def test_a_password_inside_a_url_is_hidden_everywhere() -> None:
    url = "postgres://bisect:pw-s3cr3t-77@db.internal:5432/ledger"
    result = cli("profile", "show", "reference", "--resolved", "--json",
                 "--set", f"engine.env.DATABASE_URL={url}")
    result.assert_clean()
    assert "pw-s3cr3t-77" not in result.out and "postgres://bisect:***@db.internal" in result.out
    assert redact_text(f"see {url} now", ()) == "see postgres://bisect:***@db.internal:5432/ledger now"
    assert redact(["--dist-init-addr", url])[1].startswith("postgres://bisect:***@")
    assert redact({"note": f"ran against {url}"})["note"].count("pw-s3cr3t-77") == 0


def test_counts_and_plain_numbers_are_never_secrets() -> None:
    argv = ["--max-total-tokens", "4096", "--max-prefill-tokens=8192", "--api-key", "sk-abcdefgh",
            "--disable-auth", "--port", "30000"]
    assert redact_argv(argv) == ["--max-total-tokens", "4096", "--max-prefill-tokens=8192",
                                 "--api-key", "***", "--disable-auth", "--port", "30000"]
    data = {"prompt_tokens": 12, "completion_tokens": "7", "max_total_tokens": "4096",
            "KEYS": "k-abcdefgh", "TOKEN_BUDGET": "2048", "env": {"NUM_KEYS": "16"}}
    out = redact(data)
    assert out["prompt_tokens"] == 12 and out["completion_tokens"] == "7"
    assert out["max_total_tokens"] == "4096" and out["TOKEN_BUDGET"] == "2048"
    assert out["env"] == {"NUM_KEYS": "16"} and out["KEYS"] == "***"
    assert redact_text("MAX_TOKENS=4096 HF_TOKENS=hf-abcdefgh", ()) == \
        "MAX_TOKENS=4096 HF_TOKENS=***"
    assert not is_secret_key("key") and is_secret_key("KEYS") and is_secret_key("HF_TOKENS")
    assert not is_secret_key("AUTHOR")


def test_run_json_keeps_no_secret_in_its_command_or_overrides(tmp_path: Path) -> None:
    sets = ("engine.env.HF_TOKEN=hf-planted-1234", "engine.env.SESSION_COOKIE=ck-planted-5678",
            "engine.env.DB=postgres://u:pw-planted-9012@h/db")
    command = ["dsv4bisect", "run", "reference", *(x for s in sets for x in ("--set", s)),
               "--api-key", "sk-planted-3456"]
    cfg = resolve("reference", Overrides(sets=sets))
    RunRecord.begin(tmp_path, command=command, profile="reference",
                    overrides=Overrides(sets=sets), good_overrides=Overrides(sets=sets, only=()),
                    use_cache=False, spec=tier_spec("ci"), good=cfg, candidate=cfg)
    text = (tmp_path / "run.json").read_text()
    for planted in ("hf-planted-1234", "ck-planted-5678", "pw-planted-9012", "sk-planted-3456"):
        assert planted not in text, planted
    doc = json.loads(text)
    assert doc["overrides"]["sets"][0] == "engine.env.HF_TOKEN=***"
    assert doc["command"][:3] == ["dsv4bisect", "run", "reference"]
