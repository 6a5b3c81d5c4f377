"""`--test-cmd CMD`: any command can drive the search, like `git bisect run`.

The command runs once per trial with the patch set in `DSV4BISECT_PATCHES` (the wire format of
`dsv4bisect.patching.wire` when every name is a registry patch, else a plain comma-separated
list of `name` or `name:variant`), the probe seed block in `DSV4BISECT_SEED_BLOCK` (a noisy
command may use it to vary its inputs on a re-test) and its trial directory in
`DSV4BISECT_TRIAL_DIR`. Exit status: 0 good, 125 cannot test, 1-124 bad, 126 and 127 (the
shell's "not executable" and "not found") cannot test, 128 and above (or death by a signal)
aborts the bisect. A command that cannot be started at all (not found, not executable, its
working directory gone) is CANNOT_TEST too: only a measurement of the configuration is
evidence, and a command that did not run measured nothing (`git bisect run` aborts on 126/127
for the same reason). The command runs in the working directory the bisect was started from,
recorded so that `--resume` from elsewhere runs it there. An argv list runs without a shell; a
single string runs through `/bin/sh -c` (the user asked for a shell by writing one).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dsv4bisect.bisect.trials.runner import TrialResult, TrialRunner
from dsv4bisect.errors import BisectError
from dsv4bisect.patching.wire import ENV_VAR, format_patch_set
from dsv4bisect.patchspec.spec import Patch
from dsv4bisect.probe import verdict as V

CANNOT_TEST_EXIT = 125
NOT_RUN_EXITS = {126: "found but not executable", 127: "not found"}  # POSIX shells
NOT_RUN = "not-run"  # the CANNOT_TEST signature of a command that did not run
LOG_NAME = "test-cmd.log"


class _CouldNotRun(Exception):
    """The command could not be started (OSError from exec or chdir)."""


class TestCommandRunner(TrialRunner):
    """A `Runner` that evaluates a configuration by running a command."""

    __test__ = False  # not a pytest class

    def __init__(
        self,
        command: Sequence[str] | str,
        *,
        known: Mapping[str, Patch] | None = None,
        timeout_s: float | None = None,
        cwd: str | Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if isinstance(command, str):
            if not command.strip():
                raise BisectError("the test command is empty", "e.g. --test-cmd './check.sh'")
            self.command: str | tuple[str, ...] = command
        else:
            if not command:
                raise BisectError("the test command is empty", "e.g. --test-cmd ./check.sh")
            self.command = tuple(command)
        self.known = known
        self.timeout_s = timeout_s
        self.cwd = Path(cwd) if cwd is not None else None
        self.env = dict(env) if env is not None else None

    @property
    def probe_hash(self) -> str:
        return _digest({"runner": "test-cmd", "command": self._command_json()})

    def fingerprint(self, patches: Mapping[str, str]) -> str:
        return _digest({"command": self._command_json(), "patches": sorted(patches.items())})

    def wire(self, patches: Mapping[str, str]) -> str:
        """The value of DSV4BISECT_PATCHES for a patch set."""
        known = self.known
        if known is None:
            from dsv4bisect.patching.registry import builtin_patches

            known = builtin_patches()
        if all(name in known for name in patches):
            return format_patch_set(patches, known)
        return ",".join(
            name if variant in ("", "on") else f"{name}:{variant}"
            for name, variant in sorted(patches.items())
        )

    def run(self, patches: dict[str, str], seed_block: int, trial_dir: Path) -> TrialResult:
        trial_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ if self.env is None else self.env)
        env.update(
            {
                ENV_VAR: self.wire(patches),
                "DSV4BISECT_SEED_BLOCK": str(seed_block),
                "DSV4BISECT_TRIAL_DIR": str(trial_dir),
            }
        )
        log_path = trial_dir / LOG_NAME
        start = time.monotonic()
        cwd = str(self.cwd) if self.cwd is not None else os.getcwd()
        details: dict[str, Any] = {"exit_code": None, "command": self._command_json(), "cwd": cwd}

        def result(verdict: str, signature: str | None = None) -> TrialResult:
            return TrialResult(verdict, signature=signature, duration_s=time.monotonic() - start,
                               details=details, log_path=str(log_path))

        with open(log_path, "wb") as log:
            try:
                code = self._execute(env, log)
            except _CouldNotRun as exc:
                log.write(f"dsv4bisect: {exc}\n".encode())
                details["why"] = str(exc)
                return result(V.CANNOT_TEST, NOT_RUN)
        details["exit_code"] = code
        if code is None:
            return result(V.CANNOT_TEST, "timeout")
        if code == 0:
            return result(V.PASS)
        if code == CANNOT_TEST_EXIT:
            return result(V.CANNOT_TEST)
        if code in NOT_RUN_EXITS:
            details["why"] = (f"the test command exited {code} ({NOT_RUN_EXITS[code]} in {cwd}): "
                              "it did not run, so it measured nothing")
            return result(V.CANNOT_TEST, NOT_RUN)
        if 1 <= code <= 127:
            return result(V.FAIL)
        reason = f"was killed by signal {-code}" if code < 0 else f"exited {code}"
        raise BisectError(
            f"the test command {reason}: aborting the bisect (log: {log_path})",
            "exit 0 good, 1-127 bad, 125 cannot test; 128 and above abort",
        )

    def _execute(self, env: dict[str, str], log: object) -> int | None:
        """Run the command in its own process group; None when it timed out."""
        try:
            proc = subprocess.Popen(  # an argv list, or the user's own shell string
                self.command,
                shell=isinstance(self.command, str),
                cwd=self.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,  # type: ignore[arg-type]
                start_new_session=True,
            )
        except OSError as exc:
            raise _CouldNotRun(f"cannot run the test command: {exc}") from exc
        try:
            return proc.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return None
        except BaseException:
            _kill_group(proc)
            raise

    def _command_json(self) -> str | list[str]:
        return self.command if isinstance(self.command, str) else list(self.command)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:32]
