"""Issue 31, item 7 (names a user types) and the pipe half of item 8: `profile new mine` then
`profile validate mine` finds `mine.yaml`; a typo's hint names the profile files beside it;
`patches matrix` prints tables on a terminal, Markdown when piped, and either on request;
`profile show … | head -2` exits 0 like `patches matrix | head -2`."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4bisect.config.resolve import resolve
from dsv4bisect.patching.matrix import markdown

ROOT = Path(__file__).parents[2]


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from dsv4bisect.cli import main

    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out = capsys.readouterr()
    return int(exc.value.code or 0), out.out, out.err


def test_a_new_profile_is_found_by_the_name_it_was_made_with(tmp_path: Path, monkeypatch,
                                                                capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli(capsys, "profile", "new", "mine")[0] == 0
    code, out, err = cli(capsys, "profile", "validate", "mine")
    assert code == 0, err
    assert resolve("mine").fingerprint == resolve("mine.yaml").fingerprint
    code, _, err = cli(capsys, "profile", "validate", "mien")  # a typo: the hint names the file
    assert code == 5 and "did you mean `mine`?" in err and "profile files: mine.yaml" in err
    # a built-in name keeps meaning the built-in, even with a same-named file beside it
    builtin = resolve("reference").fingerprint
    assert cli(capsys, "profile", "new", "reference", "--from", "reference-all")[0] == 0
    assert resolve("reference.yaml").fingerprint != builtin
    code, out, _ = cli(capsys, "profile", "validate", "reference")
    assert code == 0 and builtin in out


def _matrix(*args: str, tty: bool) -> str:
    if not tty:
        return subprocess.run([sys.executable, "-m", "dsv4bisect", "patches", "matrix", *args],
                              capture_output=True, text=True, check=True, cwd=ROOT).stdout
    leader, follower = os.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "dsv4bisect", "patches", "matrix", *args],
                                stdout=follower, stderr=subprocess.DEVNULL, cwd=ROOT,
                                env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"})
        os.close(follower)
        chunks = []
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:  # the terminal's other end closed
                break
            if not data:
                break
            chunks.append(data)
        assert proc.wait(timeout=120) == 0
        return b"".join(chunks).decode()
    finally:
        os.close(leader)


def test_patches_matrix_prints_tables_on_a_terminal_and_markdown_when_asked() -> None:
    on_tty = _matrix(tty=True)
    assert "<!--" not in on_tty and "|---|" not in on_tty
    assert "SM120: how each patch reaches each SGLang release" in on_tty
    assert "mhc-bf16" in on_tty and "0.5.21–0.5.23" in on_tty
    assert _matrix("--markdown", tty=True).replace("\r\n", "\n") == markdown()
    assert _matrix(tty=False) == markdown()  # piped: what docs/sglang.md holds
    plain = _matrix("--no-markdown", tty=False)
    assert "<!--" not in plain and "SM100: how each patch" in plain


@pytest.mark.parametrize("args", [("profile", "show", "reference-all", "--resolved"),
                                  ("profile", "show", "dsv4-flash-pd8-all", "--resolved", "--why"),
                                  ("profile", "show", "dsv4-flash-pd8-all", "--json"),
                                  ("patches", "matrix"), ("patches", "list")])
def test_a_reader_that_stops_early_is_not_an_error(args: tuple[str, ...]) -> None:
    """`… | head -2`: the reader closes the pipe after two lines. Rich (and Click) answer the
    broken pipe with exit 1; the CLI exits 0 and prints nothing on stderr. A reader that never
    reads makes the broken pipe certain, whatever the timing."""
    command = shlex.join([sys.executable, "-m", "dsv4bisect", *args])
    script = f'{command} | head -c 0; echo "rc=${{PIPESTATUS[0]}}"'
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True,
                       cwd=ROOT)
    assert r.stdout.strip() == "rc=0", r.stderr
    assert "Traceback" not in r.stderr and "error" not in r.stderr.lower(), r.stderr
