"""`dsv4bisect bisect --help` keeps every option it had when the command became a thin front
over bisect/session.py (issue 38): each option's flags, its metavar or choices, and its range
or default, as recorded from the command before the change; an option added since is added
here with the issue that added it."""

from __future__ import annotations

import re

import click
import typer

from dsv4bisect.cli import build_app

# (flags and metavar as --help prints them, the bracketed range/default at the end of its help)
RECORDED = [
    ("profile <str>", "[default: reference-all]"),
    ("--tier <str>", ""),
    ("--good P[:V],...|none", ""),
    ("--bad P[:V],...|none", ""),
    ("--candidates P,Q", ""),
    ("--good-config A", ""),
    ("--bad-config B", ""),
    ("--upgrade-from RELEASE", ""),
    ("--confidence <float>", ""),
    ("--max-trials <int range>", "[2<=x<=100000]"),
    ("--parallel <int range>", "[1<=x<=64]"),
    ("--warn-as <auto|fail|pass>", ""),
    ("--drift <absolute|relative>", ""),
    ("--test-cmd <str>", ""),
    ("--plan", ""),
    ("--resume RUN_DIR", ""),
    ("--out RUNS_ROOT", "[default: runs]"),
    ("--ledger <path>", ""),
    ("--false-fail <float>", ""),
    ("--false-pass <float>", ""),
    ("--launch-cost <float>", ""),
    ("--switch-cost <float>", ""),
    ("--probe-cost <float>", ""),
    ("--fresh-launches", ""),
    ("--full-ends", ""),  # added by issue 42 (the ends in one look at the full tier)
    ("--no-confirm", ""),
    ("--no-cache", ""),
    ("--nodes <int range>", "[1<=x<=64]"),
    ("--no-shard", ""),
    ("--json", ""),
    ("--format <md>", ""),
    ("--enable PATCH", ""),
    ("--disable PATCH", ""),
    ("--only P,Q", ""),
    ("--set KEY=VALUE", ""),
    ("--skip-preflight", ""),
    ("--microtest-priors / --no-microtest-priors", ""),
    ("--executor <local|ray>", ""),
    ("--ray-address ADDR", ""),
]


def _records() -> list[tuple[str, str]]:
    cmd = typer.main.get_command(build_app(["bisect"])).commands["bisect"]  # type: ignore[attr-defined]
    ctx = click.Context(cmd, info_name="bisect")
    out = []
    for param in cmd.params:
        flags, text = param.get_help_record(ctx) or (param.name or "", "")
        bracket = re.search(r"\[[^\[\]]*\]$", text.strip())
        out.append((flags, bracket.group(0) if bracket else ""))
    return out


def test_bisect_keeps_every_option_it_had():
    assert _records() == RECORDED


def test_help_prints_every_option(cli):
    proc = cli("bisect", "--help", env={"COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    for flags, _ in RECORDED[1:]:
        assert flags in proc.stdout, flags
