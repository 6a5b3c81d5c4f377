"""What `dsv4bisect bisect` shows and measures while its session runs (bisect/session.py
`Front`): the question block, the microtest priors (cli/bisect_priors.py), the plan (the whole
plan with `--plan`, on stdout with `--json`; its one line before a launch), notes, and the live
view of the trials (cli/bisect_display.py). Rich on stderr; stdout only for `--json`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from dsv4bisect.cli.bisect_display import BisectDisplay
from dsv4bisect.cli.bisect_priors import bisect_priors, say_priors
from dsv4bisect.run.events import RunEvent
from dsv4bisect.ui.console import console

if TYPE_CHECKING:  # the search needs numpy: imported when a bisect runs, not with the CLI
    from dsv4bisect.bisect.events import Event
    from dsv4bisect.bisect.plan.whole_plan import WholePlan
    from dsv4bisect.bisect.question import Question
    from dsv4bisect.bisect.session import Plan
    from dsv4bisect.bisect.setup import BisectRequest, Prepared
    from dsv4bisect.bisect.spec import BisectSpec

LEVER_NAMES = {"hot": "hot switching", "sequential": "sequential trial probe",
               "priors": "microtest priors", "priced": "priced design"}


class BisectFront:
    """The session's front on the terminal (bisect/session.py `Front`). `question`: the one
    it showed (None until then, and on a resume)."""

    def __init__(self, request: BisectRequest, json_out: bool) -> None:
        self.request, self.json_out = request, json_out
        self.display = BisectDisplay()
        self.question: Question | None = None

    def show_question(self, prep: Prepared) -> None:
        self.question = prep.question
        say_question(prep.question, prep.noise.false_fail, prep.noise.false_pass,
                     prep.noise_source)

    def priors(self, prep: Prepared) -> dict[str, float]:
        r = self.request
        measured = bisect_priors(prep.question, r.microtest_priors,
                                 test_cmd=r.test_cmd is not None, tier=r.tier,
                                 use_cache=r.use_cache)
        weights = measured.apply(prep.spec.weights)
        say_priors(measured, weights)
        return weights

    def show_plan(self, plan: Plan) -> None:
        if not plan.full:
            console().print(plan_line(plan.whole, plan.spec), markup=False, highlight=False)
        elif self.json_out:
            print(json.dumps(plan_json(plan), indent=2))
        else:
            console().print("\n".join(plan_text(plan)), markup=False, highlight=False)

    def note(self, text: str, warn: bool = False) -> None:
        console().print(text, style="yellow" if warn else "dim", markup=False,
                        highlight=False)

    def live(self) -> AbstractContextManager[Callable[[Event], None]]:
        return self.display

    def run_event(self, event: RunEvent) -> None:
        self.display.run_event(event)


def plan_line(p: WholePlan, spec: BisectSpec) -> str:
    f = p.with_levers
    line = (f"plan: {len(spec.candidates)} candidates, expected wall ≈ {dur(f.mean_wall_s)} "
            f"(p90 {dur(f.p90_wall_s)}), expected launches {f.mean_launches:.1f}, trials "
            f"{f.mean_trials:.1f}, P(correct) {f.p_correct:.2f}")
    if p.without_levers is not None:
        line += f"; without the levers ≈ {dur(p.without_levers.mean_wall_s)}"
    return line


def _figures(f: Any) -> dict[str, Any]:
    return {"mean_wall_s": f.mean_wall_s, "p90_wall_s": f.p90_wall_s,
            "mean_trials": f.mean_trials, "mean_launches": f.mean_launches,
            "p_correct": f.p_correct, "phase_s": dict(f.phase_s)}


def plan_json(plan: Plan) -> dict[str, Any]:
    """`--plan --json`: the figures with every lever, without each, without any; the costs
    with their sources; on Ray, the node table."""
    from dsv4bisect.bisect.plan.whole_plan import LEVERS
    from dsv4bisect.cli.bisect_nodes import node_json

    p, costs, spec = plan.whole, plan.costs, plan.spec
    levers = {name: ({"available": True, "saves_s": p.saves_s(name),
                      "off": _figures(p.each_off[name])} if name in p.levers
                     else {"available": False, "saves_s": 0.0}) for name in LEVERS}
    f = p.with_levers
    extra = {} if plan.nodes is None else {
        "nodes": node_json(plan.nodes, spec.parallel, [c.to_json() for c in costs.lines])}
    return {
        "n_candidates": len(spec.candidates), "candidates": list(spec.candidates),
        "runs": p.runs,
        "noise": {"false_fail": spec.noise.false_fail, "false_pass": spec.noise.false_pass},
        "trial_noise": {"false_fail": costs.trial_noise.false_fail,
                        "false_pass": costs.trial_noise.false_pass},
        "mean_launches": f.mean_launches, "mean_trials": f.mean_trials,
        "mean_wall_s": f.mean_wall_s, "p90_wall_s": f.p90_wall_s,
        "p_correct": f.p_correct, "phase_s": dict(f.phase_s),
        "with_levers": _figures(f),
        "without_levers": _figures(p.without_levers) if p.without_levers else None,
        "levers": levers, "costs": [line.to_json() for line in costs.lines],
        "load_time": sorted(costs.costs.load_time), "hot": costs.costs.hot,
        "confirm": spec.confirm, **extra}


def plan_text(plan: Plan) -> list[str]:
    """`--plan` on stderr: the plan line, every cost with its source, where the time goes,
    what each lever saves, the figure without any; on Ray, the node table."""
    from dsv4bisect.bisect.plan.whole_plan import LEVERS
    from dsv4bisect.cli.bisect_nodes import node_lines

    p, costs, spec = plan.whole, plan.costs, plan.spec
    out = [plan_line(p, spec), "costs:"]
    for line in costs.lines:
        value = (f"{line.value:.0f} s" if line.unit == "s" else f"{line.value:.2f} of the "
                 "full probe" if line.unit == "share" else f"{line.value:.0f}")
        out.append(f"  {line.name}: {value} — {line.source}")
    if costs.costs.load_time:
        out.append(f"  need a fresh launch (load time): {', '.join(sorted(costs.costs.load_time))}")
    f = p.with_levers
    out.append("where the time goes (with the levers): " + ", ".join(
        f"{name} {dur(s)}" for name, s in f.phase_s.items()))
    out.append(f"levers (each off in turn; the same {p.runs} simulated culprit sets, drawn "
               "from a flat prior, and outcomes):")
    for name in LEVERS:
        if name in p.levers:
            off = p.each_off[name]
            out.append(f"  {LEVER_NAMES[name]}: saves {dur(max(p.saves_s(name), 0))} "
                       f"(off: {dur(off.mean_wall_s)}, P(correct) {off.p_correct:.2f})")
        else:
            out.append(f"  {LEVER_NAMES[name]}: off here")
    if p.without_levers is not None:
        w = p.without_levers
        out.append(f"without any lever (fresh launches, full probes, no microtest priors, "
                   f"unpriced design; everything counted): {dur(w.mean_wall_s)} (p90 "
                   f"{dur(w.p90_wall_s)}), {w.mean_launches:.1f} launches, P(correct) "
                   f"{w.p_correct:.2f}")
    if plan.nodes is not None:
        out += node_lines(plan.nodes, spec.parallel, p.runs, dur)
    out.append(f"(simulated {p.runs} bisects per configuration; nothing was launched)")
    return out


def say_question(q: Question, false_fail: float, false_pass: float, where: str) -> None:
    con = console()
    con.print(f"candidates ({len(q.candidates)}): {', '.join(q.candidates)}", markup=False)
    for name in q.candidates:
        how = q.deliveries.get(name, "reference")
        if how != "reference" or name in q.tier_names:
            extra = [how] if how != "reference" else []
            extra += [f"tier {q.tier_names[name]}"] if name in q.tier_names else []
            extra += ["load-time" if name in q.load_time else "hot"]
            con.print(f"  {name}: {'; '.join(extra)}", markup=False, highlight=False)
    for name, why in q.left_out:
        con.print(f"left out: {name} ({why})", style="dim", markup=False)
    if q.upgrade is not None:
        from dsv4bisect.bisect.upgrade import code_bisect_hint

        old, new = q.upgrade
        con.print(f"upgrade {old} → {new}: good end = {new} with {old}'s switch defaults. If "
                  f"it fails too, the regression is in code: "
                  + code_bisect_hint(q.profile, old, new), style="dim", markup=False,
                  highlight=False)
    con.print(f"noise: false fail {false_fail:.3g}, false pass {false_pass:.3g} "
              f"({where})", style="dim", markup=False)


def dur(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"
