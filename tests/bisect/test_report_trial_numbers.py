"""Issue 31, item 4: the report named the confirmation's trial by its ledger id ("trial 13 of
the search") while its Trials table numbers steps 0-2. It now names the step of the table, or
says the trial is the ledger's from an earlier run."""

from __future__ import annotations

from dsv4bisect.bisect.report import StepView, confirmation_text


def step(n: int, trial_id: int | None) -> StepView:
    return StepView(n, ("mhc-bf16",), {"mhc-bf16": "on"}, 0, "fail", "drift", "FAIL", "run", 1,
                    1.0, {}, trial_id)


def test_the_confirmation_names_the_step_of_the_trials_table() -> None:
    conf = {"subset": ["mhc-bf16"], "agrees": True, "by_trial": 13, "skipped": None}
    text = confirmation_text(conf, (step(0, 11), step(1, 12), step(2, 13)))
    assert "(step 2 of the search ran in an engine launched in that configuration" in text
    assert "13" not in text
    other = confirmation_text(conf, (step(0, 11),))
    assert "trial 13 of the ledger, from an earlier run," in other
