"""The ledger's lock refuses what is not its own plain file (issue 30, item 6): a symlink planted
at `<runs root>/ledger.sqlite.lock` used to make a bisect (run by root, say) truncate the link's
target and write its PID into it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dsv4bisect.bisect.ledger import LOCK_SUFFIX, Ledger
from dsv4bisect.errors import BisectError

PRECIOUS = "root:x:0:0:root:/root:/bin/bash\n"


def test_a_symlinked_lock_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text(PRECIOUS)
    ledger = tmp_path / "runs" / "ledger.sqlite"
    ledger.parent.mkdir()
    Path(f"{ledger}{LOCK_SUFFIX}").symlink_to(target)
    with pytest.raises(BisectError, match="symbolic link"):
        Ledger.open(ledger)
    assert target.read_text() == PRECIOUS


def test_a_dangling_symlink_is_not_followed_to_create_a_file(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite"
    Path(f"{ledger}{LOCK_SUFFIX}").symlink_to(tmp_path / "created-elsewhere")
    with pytest.raises(BisectError, match="symbolic link"):
        Ledger.open(ledger)
    assert not (tmp_path / "created-elsewhere").exists()


def test_a_hard_linked_lock_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text(PRECIOUS)
    ledger = tmp_path / "ledger.sqlite"
    os.link(target, f"{ledger}{LOCK_SUFFIX}")
    with pytest.raises(BisectError, match="not a plain file of its own"):
        Ledger.open(ledger)
    assert target.read_text() == PRECIOUS


def test_a_fifo_lock_is_refused_without_blocking(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite"
    os.mkfifo(f"{ledger}{LOCK_SUFFIX}")
    with pytest.raises(BisectError, match="not a plain file of its own"):
        Ledger.open(ledger)


def test_a_plain_lock_still_works_and_names_its_holder(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite"
    with Ledger.open(ledger):
        assert Path(f"{ledger}{LOCK_SUFFIX}").read_text() == f"{os.getpid()}\n"
