"""diff-config on shipped profiles, through the real CLI process."""

from __future__ import annotations

import json

from dsv4bisect.config.diff import argv_items, diff_configs
from dsv4bisect.config.resolve import Overrides, resolve


def test_identical_profiles_exit_0(cli) -> None:
    proc = cli("diff-config", "reference", "reference")
    assert proc.returncode == 0, proc.stderr
    assert "identical" in proc.stdout


def test_tp8_vs_all_shows_patches_and_env_flag_by_flag(cli) -> None:
    proc = cli("diff-config", "dsv4-flash-tp8", "dsv4-flash-tp8-all", "--json")
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    changes = {(c["section"], c["key"]): (c["a"], c["b"]) for c in data["changes"]}
    assert changes[("patches", "mma-decode")] == ("off", "split-k")
    assert changes[("env:server", "DSV4BISECT_PATCHES")][0] == "hash-topk-scaling"
    assert ("fingerprint", "fingerprint") in changes
    assert not any(s.startswith("process:") for s, _ in changes)  # same argv


def test_tp8_vs_pd8_compares_processes() -> None:
    changes = diff_configs(resolve("dsv4-flash-tp8"), resolve("dsv4-flash-pd8"))
    roles = {c.key: (c.a, c.b) for c in changes if c.section == "processes"}
    assert roles == {"server": (True, False), "prefill": (False, True), "decode": (False, True),
                     "router": (False, True)}


def test_argv_diff_is_flag_by_flag_and_secrets_are_redacted() -> None:
    a = resolve("dsv4-flash-tp8", Overrides(sets=("engine.args=[--api-key, s3cret, --tp-x]",
                                                   "engine.env.HF_TOKEN=abc")))
    b = resolve("dsv4-flash-tp8", Overrides(sets=("engine.args=[--api-key, other]",
                                                   "engine.env.HF_TOKEN=xyz")))
    changes = diff_configs(a, b)
    text = repr(changes)
    assert "s3cret" not in text and "abc" not in text and "xyz" not in text
    keys = {(c.section, c.key) for c in changes}
    assert ("process:server", "--tp-x") in keys
    assert ("process:server", "--api-key") not in keys  # both redacted: equal


def test_argv_items() -> None:
    items = argv_items(["python3", "-m", "x", "--prefill", "http://h:1", "8998", "--flag",
                        "--port=3"])
    assert items == {"(command)": "python3 -m x", "--prefill": "http://h:1 8998", "--flag": "",
                     "--port": "3"}
