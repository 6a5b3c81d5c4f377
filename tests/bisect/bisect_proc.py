"""Run a `--test-cmd` bisect in its own process (the SIGKILL test kills this process).

usage: bisect_proc.py start|resume RUN_DIR LEDGER LOG CULPRITS DELAY_S
Prints the result as JSON on stdout.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from dsv4bisect.bisect.driver import resume_bisect, start_bisect
from dsv4bisect.bisect.ledger import Ledger
from dsv4bisect.bisect.search.design import Noise
from dsv4bisect.bisect.spec import BisectSpec
from dsv4bisect.bisect.trials.testcmd import TestCommandRunner
from dsv4bisect.patching.registry import builtin_patches

CHECK = Path(__file__).with_name("fake_check.py")


def main() -> int:
    mode, run_dir, ledger_path, log, culprits, delay = sys.argv[1:7]
    os.environ["FAKE_CHECK_DELAY"] = delay  # not in the command: it is no part of the question
    runner = TestCommandRunner([sys.executable, str(CHECK), log, culprits])
    if mode == "start":
        patches = builtin_patches()
        spec = BisectSpec(
            candidates=tuple(patches),
            good={},
            bad={name: p.default_variant for name, p in patches.items()},
            noise=Noise(),
        )
        with Ledger.open(ledger_path) as ledger:
            outcome = start_bisect(spec, runner, ledger, run_dir)
    else:
        outcome = resume_bisect(run_dir, runner)
    print(
        json.dumps(
            {
                "status": outcome.result.status.value,
                "culprits": sorted(outcome.result.culprits or ()),
                "trials_run": outcome.trials_run,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
