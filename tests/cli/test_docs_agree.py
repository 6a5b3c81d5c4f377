"""Issue 41, item 12: docs that disagreed with the tool, and `patches` alone.

Each test holds one place where the words and the behaviour had parted: the tool is run (or
its text produced) and the page read.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from dsv4bisect.config.starter import starter_profile

ROOT = Path(__file__).parents[2]


def test_patches_alone_lists_them_as_patches_list(cli) -> None:
    alone, listed = cli("patches"), cli("patches", "list")
    assert alone.returncode == 0, alone.stderr  # it printed usage and exited 2
    assert alone.stdout == listed.stdout and "mma-decode" in alone.stdout


def test_the_starter_profile_says_what_warn_as_auto_does() -> None:
    text = starter_profile("mine", None)
    comment = text[text.index("bisect:"):]
    assert "like the bad end when the" in comment and "bad end itself only drifts" in comment
    assert "like the good end when the bad" in comment and "loses facts" in comment
    assert "counts as FAIL in a search unless" not in text  # what it used to say
    assert yaml.safe_load(text)["bisect"]["warn_as"] == "auto"  # and the value is auto


def test_reference_api_says_sampling_and_streaming_where_it_said_greedy_only() -> None:
    page = (ROOT / "docs" / "reference-api.md").read_text()
    assert "greedy only" not in page.lower()
    assert "No streaming" not in page and "### Streaming" in page
    assert "`stream` (false)" not in page


def test_switches_of_an_embedded_profile_works_as_the_page_says(cli) -> None:
    result = cli("switches", "reference", "--json")
    assert result.returncode == 0, result.stderr
    page = (ROOT / "docs" / "sglang.md").read_text()
    assert "5 on bad input (an embedded-engine\nprofile," not in page
    assert "An embedded-engine profile (`dsv4bisect\nswitches reference`) lists" in page


def test_the_lm_eval_script_names_the_extra_its_client_needs() -> None:
    script = (ROOT / "tests" / "benchmarks" / "lm_eval_loglikelihood.py").read_text()
    assert "`pip install\n'lm-eval[api]'`" in script and "hint: pip install 'lm-eval[api]'" in script
    assert "a bare `pip install lm_eval` lacks them" in script
