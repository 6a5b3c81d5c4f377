"""A bisect's report, from its run directory and the ledger (pure: nothing is launched).

`load_bisect(dir)` reads bisect.json and the ledger (the run's settings, the search's steps and
their trials) and replays the steps into a fresh search for the posterior over trials;
`report_json`, `render_markdown` and `terminal_lines` render it; `render_posterior` draws
posterior.png (matplotlib optional); `write_report` writes all three into the run directory.
`dsv4bisect report RUN_DIR` re-renders any of them.
"""

from __future__ import annotations

import json
import math
import shlex
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsv4bisect.bisect.driver import read_run_file
from dsv4bisect.bisect.events import result_json
from dsv4bisect.bisect.ledger import open_holding
from dsv4bisect.bisect.search.design import Noise, capacity
from dsv4bisect.bisect.spec import BisectSpec
from dsv4bisect.errors import Dsv4BisectError
from dsv4bisect.policy import TrialPolicy
from dsv4bisect.probe import verdict as V
from dsv4bisect.redact import redact, redact_text, secrets_in

REPORT_SCHEMA = "dsv4bisect.bisect-report/1"
PLOT = "posterior.png"
STYLES = {"found": "bold green", "several": "bold green", "running": "bold yellow"}
Line = tuple[str, "str | None"]


@dataclass(frozen=True)
class StepView:
    """One probe result the search used, with the trial behind it."""

    step: int
    subset: tuple[str, ...]  # candidates switched to their bad-end state
    patches: dict[str, str]  # the whole patch set of that configuration
    seed_block: int
    outcome: str  # pass | fail | skip
    signature: str | None
    verdict: str | None
    source: str  # run (launched by this bisect) | ledger (a finished trial reused) | skip
    attempts: int  # launches this bisect made for this step
    duration_s: float | None
    details: dict[str, Any]
    trial_id: int | None = None  # the ledger's id of the trial behind this step


@dataclass(frozen=True)
class BisectView:
    run_dir: Path
    run_id: str
    request: dict[str, Any]
    spec: BisectSpec
    status: str
    result: dict[str, Any]  # result_json() of the search (replayed while it runs)
    steps: tuple[StepView, ...]
    launches: int  # trial attempts this bisect started
    history: tuple[dict[str, float], ...]  # the final top five's posterior: prior, each step
    ledger: str
    relaunches: tuple[str, ...] = ()  # why each engine kept up between trials was relaunched


def load_bisect(run_dir: str | Path) -> BisectView:
    root = Path(run_dir)
    info = read_run_file(root)
    # the ledger beside a moved runs root, else the recorded one; a report writes nothing
    with open_holding(root, Path(info["ledger"]), info["run_id"]) as ledger:
        run = ledger.get_run(info["run_id"])
        rows = ledger.trials(run.id)
        steps = ledger.steps(run.id)
        decisive = {s.trial_id: ledger.trial(s.trial_id) for s in steps if s.trial_id}
    spec = BisectSpec.from_json(run.settings)
    search = spec.search()
    posts = [{h.describe(): p for h, p in _all(search)}]  # the prior, before any trial
    for step in steps:  # with the error rates each verdict held to, as the driver did
        decided = decisive.get(step.trial_id) if step.trial_id else None
        rates = decided.details.get("error_rates") if decided else None
        search.record(step.subset, V.FROM_SEARCH_WORD[step.outcome],
                      noise=Noise(*rates) if rates else None)
        posts.append({h.describe(): p for h, p in _all(search)})
    result = run.result if run.result else result_json(search.result())
    names = [t["hypothesis"] for t in result["top"]]  # the final top five, tracked over trials
    history = tuple({n: p.get(n, 0.0) for n in names} for p in posts)
    views = []
    for s in steps:
        trial = decisive.get(s.trial_id)
        launched = [r for r in rows if r.step == s.step]
        source = "skip" if s.outcome == "skip" else (
            "run" if trial is not None and trial.run_id == run.id else "ledger")
        views.append(StepView(
            s.step, tuple(sorted(s.subset)), dict(trial.patches) if trial else
            spec.patches_for(s.subset), s.seed_block, s.outcome, s.signature,
            trial.verdict if trial else None, source, len(launched),
            trial.duration_s if trial else None, dict(trial.details) if trial else {},
            s.trial_id or None))
    relaunched = [r.details.get("relaunched") for r in rows]
    return BisectView(root, run.id, dict(info.get("request") or {}), spec, run.status, result,
                      tuple(views), len(rows), history, str(ledger.path),
                      tuple(str(w) for ws in relaunched if isinstance(ws, list) for w in ws))


def _all(search: Any) -> list[tuple[Any, float]]:
    post = search.posterior()
    return [(search.space.hypothesis(i), float(p)) for i, p in enumerate(post) if p > 1e-4]


# -- figures ------------------------------------------------------------------------------------
def bound(view: BisectView) -> dict[str, Any]:
    """Launches used against the information bound: log2(number of culprit sets) bits, and the
    trials that takes at the probe's noise (its capacity in bits per trial)."""
    n = len(view.spec.candidates)
    sets = sum(math.comb(n, k) for k in range(1, view.spec.max_order + 1))
    bits = math.log2(sets) if sets > 1 else 0.0
    cap = capacity(view.spec.noise)
    return {"hypotheses": sets, "bits": round(bits, 2), "capacity": round(cap, 3),
            "trials_bound": round(bits / cap, 1) if cap > 0 else None,
            "steps": len(view.steps), "launches": view.launches,
            "relaunches": len(view.relaunches),
            "reused": sum(s.source == "ledger" for s in view.steps)}


def neighbours(view: BisectView) -> list[dict[str, Any]]:
    """diff-config between the culprit set's passing and failing neighbours: each member
    removed (passes) against the set alone (fails), and the bad end without the set against
    the set alone. Needs the profile (resolved again); a note when it cannot be resolved."""
    culprits = view.result.get("culprits")
    profile = view.request.get("profile")
    if not culprits or not profile:
        return []
    from dsv4bisect.bisect.question import patch_overrides
    from dsv4bisect.config.diff import diff_configs
    from dsv4bisect.config.resolve import resolve

    spec, sets = view.spec, tuple(view.request.get("sets") or ())
    alone = frozenset(culprits)
    pairs = [(f"{{{', '.join(sorted(alone - {x}))}}} (passes)" if len(alone) > 1
              else "good end (passes)", alone - {x}, x) for x in sorted(alone)]
    rest = frozenset(spec.candidates) - alone
    if rest:
        pairs.append((f"bad end without the culprits ({remedy_text(view)})", rest, None))
    out = []
    for label, passing, member in pairs:
        try:
            a = resolve(profile, patch_overrides(spec.patches_for(passing), sets))
            b = resolve(profile, patch_overrides(spec.patches_for(alone), sets))
        except Dsv4BisectError as exc:
            return [{"note": f"configurations not resolved: {exc.message}"}]
        changes = [{"section": c.section, "key": c.key, "passing": c.a, "failing": c.b}
                   for c in diff_configs(a, b)]
        out.append({"passing": label, "failing": f"{{{', '.join(sorted(alone))}}} (fails)",
                    "member": member, "changes": changes})
    return out


REMEDY_TEXT = {
    "passes": "passes",
    "fails": "FAILS: another culprit remains",
    "mixed": "one pass, one fail: inside the probe's noise",
    "untested": "could not be tested",
}


def remedy_text(view: BisectView) -> str:
    """What the remedy check (bisect/remedy.py) measured on the bad end without the culprits."""
    remedy = view.result.get("remedy")
    if not remedy:
        return "not measured"
    runs = "/".join(remedy["outcomes"]) or "-"
    return f"{REMEDY_TEXT.get(remedy['verdict'], remedy['verdict'])}; measured {runs}"


def remedy_advice(view: BisectView) -> str | None:
    """The next command when the bad end still fails without the culprits."""
    remedy = view.result.get("remedy")
    if not remedy or remedy["verdict"] != "fails":
        return None
    rest = ",".join(n for n in view.spec.candidates if n in remedy["subset"])
    # what the remedy check held off, not the final result: after singles that explain nothing
    # the result names no culprit, but the measured bad end still went without these
    held = [n for n in view.spec.candidates if n not in remedy["subset"]]
    return (f"the bad end still fails without {_set(held)}: bisect the rest (those held off "
            f"at their good-end state) with `{remedy_command(view.request, rest)}`")


_DROP_VALUE = ("--candidates", "--resume")  # options (with a value) the next bisect replaces
_DROP_FLAG = ("--json", "--plan")


def remedy_command(request: dict[str, Any], rest: str) -> str:
    """The whole command that bisects `rest`: the original one, its --candidates replaced
    (rebuilt from the request when it was a --resume, which names no profile)."""
    command = [str(t) for t in request.get("command") or ()]
    if not command or any(t.split("=", 1)[0] == "--resume" for t in command):
        command = ["dsv4bisect", "bisect", str(request.get("profile") or "PROFILE")]
        if request.get("test_cmd"):
            command += ["--test-cmd", str(request["test_cmd"])]
        for item in request.get("sets") or ():
            command += ["--set", str(item)]
        if request.get("tier"):
            command += ["--tier", str(request["tier"])]
    out, skip = [], False
    for token in command:
        if skip:
            skip = False
            continue
        name = token.split("=", 1)[0]
        if name in _DROP_VALUE:
            skip = "=" not in token
            continue
        if token not in _DROP_FLAG:
            out.append(token)
    return shlex.join([*out, "--candidates", rest])


def reproduce(view: BisectView, step: StepView) -> str:
    """The command that asks one trial's question again, made to exit as the trial was
    counted (a drift WARN with `--warn-as fail` where it counted as a fail), or saying why it
    cannot."""
    line = _line_of(view, step.patches, step.seed_block, step.details)
    if view.request.get("test_cmd"):
        return line  # the command's own exit is the verdict
    argv, _, note = line.partition("  # ")
    word, why = run_word(step), None
    if step.outcome == "skip":
        why = "the trial could not be tested"
    elif step.outcome == "between":
        why = "counted as between the ends: `run` has no such verdict"
    elif word == "WARN":
        argv += f" --warn-as {step.outcome}"
        why = f"WARN, counted as {step.outcome}: exits {0 if step.outcome == 'pass' else 1}"
    elif word in (V.PASS, V.FAIL) and word.lower() != step.outcome:
        why = (f"counted as {step.outcome} by the trial probe; `run` probes the whole tier and "
               f"judged it {word}")
    return argv + "".join(f"  # {t}" for t in (note, why) if t)


def _line_of(view: BisectView, patches: dict[str, str], seed_block: int,
             details: dict[str, Any] | None = None) -> str:
    """The runner's own line for a configuration: the one its trial recorded, else built
    as the runner builds it (bisect/trials/reproduce.py)."""
    cmd = view.request.get("test_cmd")
    if cmd:
        from dsv4bisect.bisect.trials.testcmd import TestCommandRunner

        try:
            wire = TestCommandRunner(cmd).wire(patches)
        except Dsv4BisectError:  # a registry that no longer knows a name
            wire = ",".join(f"{n}:{v}" for n, v in patches.items())
        return (f"DSV4BISECT_PATCHES={shlex.quote(wire)} "
                f"DSV4BISECT_SEED_BLOCK={seed_block} {cmd}")
    if details and details.get("command"):
        return str(details["command"])
    return _built_line(view, patches, seed_block)


def _built_line(view: BisectView, patches: dict[str, str], seed_block: int) -> str:
    from dsv4bisect.bisect.question import patch_overrides
    from dsv4bisect.bisect.trials.reproduce import trial_line
    from dsv4bisect.config.resolve import resolve
    from dsv4bisect.run.ends import probe_spec

    req = view.request
    profile, sets = str(req.get("profile") or ""), tuple(req.get("sets") or ())
    if not profile:  # a bisect driven without a profile (the library, a test): no `run` line
        return "-  # no profile in the bisect's request: no `run` line to print"
    try:
        good = resolve(profile, patch_overrides(dict(view.spec.good), sets))
        cand = resolve(profile, patch_overrides(patches, sets))
    except Dsv4BisectError as exc:
        return f"-  # configurations not resolved: {exc.message}"
    return trial_line(profile, patches, sets, tier=probe_spec(good, req.get("tier")).tier,
                      seed_block=seed_block, good_config=req.get("good_config"), good=good,
                      candidate=cand).text()


def culprit_lines(view: BisectView) -> list[str]:
    """`run` lines of the good end with each culprit set alone (one for FOUND; one per culprit
    for SEVERAL), made to exit 1 where the bisect counted it a fail."""
    r = view.result
    if r["status"] not in ("found", "several") or not r.get("culprits"):
        return []
    sets = ([frozenset(r["culprits"])] if r["status"] == "found"
            else [frozenset({c}) for c in ranked_culprits(view)])
    out = []
    for alone in sets:
        ran = [s for s in view.steps if frozenset(s.subset) == alone and s.outcome == "fail"]
        if ran:
            out.append(reproduce(view, ran[0]))
            continue
        line = _line_of(view, view.spec.patches_for(alone), 0)
        if not view.request.get("test_cmd") and _on_drift(view):  # its WARN is the fail
            argv, sep, note = line.partition("  # ")
            line = f"{argv} --warn-as fail{sep}{note}"
        out.append(line)
    return out


# -- one vocabulary from trial to headline (issue 41, item 4) -----------------------------------
def run_word(step: StepView) -> str:
    """The verdict `run` gives a trial's configuration (`verdict.as_run_says`)."""
    return V.as_run_says(step.verdict, step.signature,
                         (step.details.get("drift") or {}).get("status"))


def counted_text(view: BisectView, step: StepView) -> str:
    """What the search counted a trial as, and why where the verdict's word differs."""
    word = run_word(step)
    if step.outcome == "skip":
        return "skip (not tested)"
    if word != V.WARN:
        return step.outcome
    if step.verdict == V.WARN:  # a whole `run` judged it: the trial policy counted its WARN
        return f"{step.outcome} (a WARN counts as {step.outcome}: {_warn_rule(view)})"
    return {"fail": "fail (its drift is like the bad end's)",
            "pass": "pass (its drift is like the good end's)",
            "between": "between (its drift lies between the ends')"}.get(step.outcome,
                                                                        step.outcome)


def _warn_rule(view: BisectView) -> str:
    policy = TrialPolicy.from_json(view.request)
    if policy.warn_as.value != "auto":
        return f"--warn-as {policy.warn_as.value}"
    return ("--warn-as auto, the bad end only drifts" if _on_drift(view)
            else "--warn-as auto, the bad end loses facts")


def _bad_end(view: BisectView) -> StepView | None:
    """The bad end's first measurement (every candidate switched)."""
    every = set(view.spec.candidates)
    return next((s for s in view.steps if set(s.subset) == every and s.verdict), None)


def _on_drift(view: BisectView) -> bool:
    """The bad end lost no facts: its drift is what the trials were told apart by."""
    bad = _bad_end(view)
    return bad is not None and bad.outcome == "fail" and run_word(bad) == V.WARN


def _kl(step: StepView, where: str | None = None) -> float | None:
    """A trial's mean KL: in view `where` (None: the view that triggered its own verdict)."""
    drift = step.details.get("drift") or {}
    kl = (drift.get("kl_by_view") or {}).get(where) if where is not None \
        and drift.get("where") != where else drift.get("kl_mean")
    return float(kl) if isinstance(kl, (int, float)) else None


def decided_on_drift(view: BisectView) -> str | None:
    """What decided the bisect, in its own words, where it was the drift."""
    bad = _bad_end(view)
    if bad is None or not _on_drift(view):
        return None
    d, kl = bad.details.get("drift") or {}, _kl(bad)
    where = f" at {d['where']}" if d.get("where") else ""
    size = f", mean KL {kl:.3g}{where}" if kl is not None else ""
    policy = TrialPolicy.from_json(view.request)
    if policy.sequential:  # each trial's drift against the two ends' (probe/sequential.py)
        return (f"bisected on drift relative to the two ends: the bad end loses no facts (its "
                f"drift WARNs{size}); a trial counts as fail where its drift is like the bad "
                "end's, pass where like the good end's")
    return (f"bisected on drift: the bad end loses no facts (its drift WARNs{size}); a "
            f"trial's drift WARN counts as fail ({_warn_rule(view)})")


ALL_POSITIONS = "all positions"  # probe/null.py's view of every scored position


def drift_shares(view: BisectView, where: str | None = ALL_POSITIONS
                 ) -> dict[str, float | None]:
    """Each culprit's share of the bad end's drift: the mean KL of its runs alone over the bad
    end's, both in view `where` (all positions: the whole drift; None: the view that set the
    bad end's verdict, as the sequential trial probe compares a trial with the ends); None
    where a run kept no figure in that view."""
    bad = _bad_end(view)
    if bad is None:
        return {name: None for name in view.result.get("culprits") or ()}
    where = where or (bad.details.get("drift") or {}).get("where")
    bad_kl = _kl(bad, where)
    out: dict[str, float | None] = {}
    for name in view.result.get("culprits") or ():
        kls = [k for s in view.steps if s.subset == (name,) and (k := _kl(s, where)) is not None]
        out[name] = sum(kls) / len(kls) / bad_kl if kls and bad_kl else None
    return out


def ranked_culprits(view: BisectView) -> list[str]:
    """The culprits, the largest share of the bad end's whole drift first (by name
    otherwise)."""
    shares = drift_shares(view) if _on_drift(view) else {}
    return sorted(view.result.get("culprits") or (),
                  key=lambda n: (-(shares.get(n) or 0.0), n))


def _shares_text(view: BisectView, name: str) -> str:
    """` 96 % (92 % at answer positions)`: a culprit's share of the bad end's whole drift, and
    in the view that set the bad end's verdict where that is another."""
    whole = drift_shares(view).get(name)
    bad = _bad_end(view)
    where = (bad.details.get("drift") or {}).get("where") if bad is not None else None
    there = drift_shares(view, None).get(name) if where != ALL_POSITIONS else None
    out = f" {_share(whole)}" if whole is not None else ""
    return out + (f" ({_share(there)} at {where})" if there is not None and where else "")


def culprit_label(view: BisectView, name: str) -> str:
    """A culprit as FOUND names it: with its variant where a variant is what differs
    (`mma-decode (variant swa-ring-stale)`), a setting with its two values."""
    from dsv4bisect.bisect.setting_candidates import is_setting
    from dsv4bisect.patching.registry import builtin_patches

    good, bad = dict(view.spec.good).get(name), dict(view.spec.bad).get(name)
    if bad is None:
        return name
    if is_setting(name):
        return f"{name} ({good} → {bad})"
    patch = builtin_patches().get(name)
    default = patch.default_variant if patch is not None else None
    return f"{name} (variant {bad})" if good is not None or bad != default else name


def headline(view: BisectView) -> str:
    """The result's sentence: culprits with their variants; several culprits on drift ranked
    by their share of the bad end's drift."""
    r = view.result
    if r["status"] == "found" and r.get("culprits"):
        names = ", ".join(culprit_label(view, n) for n in sorted(r["culprits"]))
        return f"culprit {{{names}}} (posterior {r['posterior']:.3f}), each member needed"
    if r["status"] == "several" and r.get("culprits"):
        on_drift = _on_drift(view)
        names = ", ".join(culprit_label(view, n) + (_shares_text(view, n) if on_drift else "")
                          for n in ranked_culprits(view))
        how = (", ranked by their share of the bad end's drift (mean KL over all positions)"
               if on_drift and any(v is not None for v in drift_shares(view).values()) else "")
        return (f"several culprits, each failing on its own{how}: {names} (the good end "
                "passed every time it was measured)")
    return str(r["message"])


def _share(x: float) -> str:
    return f"{100 * x:.0f} %" if x >= 0.1 else f"{100 * x:.2g} %"


SEVERAL_NOTE = ("the hypotheses are single culprit sets (a configuration fails iff it holds "
                "all of one set): several culprits each failing alone lie outside them, which "
                "is why `unexplained` leads; the culprits were named by their runs alone")


def _report_json(view: BisectView) -> dict[str, Any]:
    return {
        "schema": REPORT_SCHEMA, "run_id": view.run_id, "run_dir": str(view.run_dir),
        "status": view.result["status"], "culprits": view.result.get("culprits"),
        "posterior": view.result.get("posterior"), "message": view.result.get("message"),
        "headline": headline(view), "decided_on_drift": decided_on_drift(view),
        "culprit_shares": drift_shares(view) if _on_drift(view) else None,
        "culprit_lines": culprit_lines(view),
        "top": view.result.get("top"), "checks": view.result.get("checks"),
        "remedy": view.result.get("remedy"), "confirmation": view.result.get("confirmation"),
        "request": view.request, "settings": view.spec.to_json(), "ledger": view.ledger,
        "bound": bound(view),
        "relaunches": {"count": len(view.relaunches), "why": list(view.relaunches)},
        "trials": [{"step": s.step, "subset": list(s.subset), "patches": s.patches,
                    "seed_block": s.seed_block, "verdict": s.verdict, "outcome": s.outcome,
                    "run_verdict": run_word(s), "counted_as": counted_text(view, s),
                    "signature": s.signature, "source": s.source, "attempts": s.attempts,
                    "duration_s": s.duration_s, "scores": _scores(s.details),
                    "baseline_cached": s.details.get("baseline_cached"),
                    "bad_end_cached": bool(s.details.get("bad_end_cached")),
                    "mode": s.details.get("mode"), "fresh_launch": s.details.get("fresh_launch"),
                    "requests": s.details.get("requests"), "node": _node(s.details),
                    "trial_run_dir": s.details.get("run_dir"), "ledger_trial": s.trial_id,
                    "reproduce": reproduce(view, s), **_look(s.details)} for s in view.steps],
        "neighbours": neighbours(view),
        "posterior_history": list(view.history),
    }


def _scores(details: dict[str, Any]) -> dict[str, Any]:
    drift = details.get("drift") or {}
    out: dict[str, Any] = {}
    if drift.get("status"):
        out["drift"] = {k: drift.get(k) for k in ("status", "where", "kl_mean", "top1_agreement")}
    fams = details.get("families") or {}
    if fams:
        out["accuracy"] = {f: [r.get("baseline_accuracy"), r.get("candidate_accuracy")]
                           for f, r in fams.items()}
    if "exit_code" in details:
        out["exit_code"] = details["exit_code"]
    return out


def _score_text(details: dict[str, Any]) -> str:
    s = _scores(details)
    parts = []
    if "drift" in s:
        d = s["drift"]
        kl, top1 = d.get("kl_mean"), d.get("top1_agreement")
        parts.append(f"drift {d['status']}" + (f" KL {kl:.2g}" if kl is not None else "")
                     + (f" top-1 {top1:.1%}" if top1 is not None else ""))
    if "exit_code" in s:
        parts.append(f"exit {s['exit_code']}")
    return "; ".join(parts) or "-"


# -- markdown -----------------------------------------------------------------------------------
def _set(names: Any) -> str:
    return "{" + ", ".join(sorted(names)) + "}" if names else "∅ (good end)"


def _patch_text(patches: dict[str, str]) -> str:
    return ", ".join(f"{n}:{v}" for n, v in patches.items()) or "none"


def _render_markdown(view: BisectView, plot_note: str | None = None) -> str:
    r, b = view.result, bound(view)
    lines = [f"# dsv4bisect bisect: {r['status']} — {headline(view)}", ""]
    req = view.request
    runner = (f"test command `{req['test_cmd']}`" if req.get("test_cmd") else
              f"engine + probe, tier {req.get('tier') or 'profile default'}")
    noise = view.spec.noise
    lines += [f"- profile: `{req.get('profile', '?')}`; runner: {runner}",
              f"- good end: {_patch_text(dict(view.spec.good))}",
              f"- bad end: {_patch_text(dict(view.spec.bad))}",
              f"- candidates: {', '.join(view.spec.candidates)}"]
    for name, why in req.get("left_out") or ():
        lines.append(f"- left out: {name} ({why})")
    lines += [(f"- confidence {view.spec.confidence}, noise: false fail "
               f"{noise.false_fail:.3g}, false pass {noise.false_pass:.3g}; trial policy: "
               f"{TrialPolicy.from_json(req).describe()}"),
              f"- run `{view.run_id}`, ledger `{view.ledger}`", "", "## Result", "",
              headline(view), ""]
    drift = decided_on_drift(view)
    lines += [f"{drift[0].upper()}{drift[1:]}.", ""] if drift else []
    if r["status"] == "several":
        lines += [f"{SEVERAL_NOTE[0].upper()}{SEVERAL_NOTE[1:]}:", ""]
    lines += ["| hypothesis | posterior |", "| --- | --- |"]
    lines += [f"| {t['hypothesis']} | {t['posterior']:.4f} |" for t in r["top"]]
    if r.get("checks"):
        lines += ["", "| check | configuration | expect | log10 ratio | fresh | trials | ok |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {c['member'] or '-'} | {_set(c['config'])} | {c['expect']} | "
                  f"{c['log10_ratio']:.2f} | {c['fresh_log10_ratio']:.2f} | {c['trials']} | "
                  f"{'yes' if c['confirmed'] else 'no'} |" for c in r["checks"]]
    if view.result.get("remedy"):
        lines += ["", f"Remedy check — the bad end without the culprits: {remedy_text(view)}."]
        advice = remedy_advice(view)
        lines += [f"**{advice[0].upper() + advice[1:]}.**"] if advice else []
    if view.result.get("confirmation"):
        lines += ["", confirmation_text(view.result["confirmation"], view.steps) + "."]
    lines += ["", "## Trials", "",
              ("| step | switched to bad | seed block | verdict | counted as | signature | scores "
               "| requests | mode | duration | source |"),
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in view.steps:
        dur = f"{s.duration_s:.1f} s" if s.duration_s is not None else "-"
        cached = " (baseline cached)" if s.details.get("baseline_cached") else ""
        cached += " (bad end cached by a run)" if s.details.get("bad_end_cached") else ""
        lines.append(f"| {s.step} | {_set(s.subset)} | {s.seed_block} | {run_word(s)} | "
                     f"{counted_text(view, s)} | {s.signature or '-'} | {_score_text(s.details)} | "
                     f"{s.details.get('requests', '-')} | {_mode(s.details)} | "
                     f"{dur} | {s.source}{cached}{_where(s.details)} |")
    lines += ["", "## Launches against the information bound", "",
              (f"{b['steps']} probe results used ({b['launches']} launched by this bisect, "
               f"{b['reused']} reused from the ledger). {b['hypotheses']} culprit sets: "
               f"log2 = {b['bits']} bits; at this noise the probe carries {b['capacity']} bits "
               f"per trial: information bound ≈ {b['trials_bound']} trials (the end checks "
               "and the confirmations come on top)."), ""]
    lines += [relaunch_text(view), ""] if view.relaunches else []
    lines += _md_neighbours(neighbours(view))
    lines += ["## Reproduce", "",
              "Each trial as `dsv4bisect run` measures it, exiting as the bisect counted it "
              "(verdict column: what `run` prints).", ""]
    lines += [f"- step {s.step}: `{reproduce(view, s)}`" for s in view.steps]
    lines += [f"- the culprit alone: `{line}`" for line in culprit_lines(view)]
    lines += ["", plot_note or f"Posterior over trials: `{PLOT}`.",
              f"Re-render: `dsv4bisect report {view.run_dir}`.", ""]
    return "\n".join(lines)


def _node(details: dict[str, Any]) -> dict[str, Any] | None:
    """Which node ran the trial and when (`--executor ray`: name, id, start and end, UTC
    seconds; `replicas`: the idle nodes its probe was sharded across, each with when its
    engine was ready and when the trial ended), or None on this machine."""
    node = details.get("node")
    return dict(node) if isinstance(node, dict) else None


def _where(details: dict[str, Any]) -> str:
    """`; on NODE, HH:MM:SS-HH:MM:SS UTC` for a trial a Ray node ran (else nothing): which node
    measured what, and when (a round's trials overlap in time on different nodes)."""
    node = _node(details)
    if node is None:
        return ""

    def clock(t: Any) -> str:
        return (time.strftime("%H:%M:%S", time.gmtime(float(t)))
                if isinstance(t, (int, float)) else "?")

    shared = "".join(f" + {r.get('name', '?')} ({clock(r.get('started'))}-"
                     f"{clock(r.get('finished'))})" for r in node.get("replicas") or ())
    ahead = node.get("ahead") if isinstance(node.get("ahead"), dict) else None
    # a bad end beside the good end: its accuracy requests sent before the good end's run
    # existed, its drift scoring after (probe/ahead.py; docs/cluster.md, "Sharded rows")
    started = (f", started ahead of the good end ({ahead.get('rows', '?')} rows "
               f"{clock(ahead.get('started'))}-{clock(ahead.get('finished'))}, finished with "
               f"its run from {clock(ahead.get('resumed'))})" if ahead else "")
    return f"; on {node.get('name', '?')}, {clock(node.get('started'))}-" \
           f"{clock(node.get('finished'))} UTC" + (f", probe sharded{shared}" if shared else "") \
        + started


def relaunch_text(view: BisectView) -> str:
    """The engines kept up between trials that were found gone or unhealthy and relaunched
    (bisect/trials/engine_pool.py `get`), each reason once with its count."""
    counts = Counter(view.relaunches)
    why = "; ".join(f"{w} (×{n})" if n > 1 else w for w, n in counts.items())
    return (f"{len(view.relaunches)} engine(s) kept up between trials were found unable to "
            f"serve and relaunched: {why}")


def _mode(details: dict[str, Any]) -> str:
    """`hot`, `fresh`, or `hot, launched` for a hot runner's trial that launched its engine in
    its own configuration (a fresh launch's measurement); a bad end's trial probed in looks
    adds the look that settled its ends (`look 1: accuracy`, `look 2`)."""
    mode = details.get("mode", "fresh")
    mode = "hot, launched" if mode == "hot" and details.get("fresh_launch") else mode
    look = _look(details)
    if look:
        why = look["settled_by"]
        mode += f", look {look['end_look']}" + (f": {why}" if why else "")
    return mode


def _look(details: dict[str, Any]) -> dict[str, Any]:
    """A bad end's trial with looks: the look that settled its ends and why (docs/bisect.md,
    "Ends that stop when their question is answered"); nothing for any other trial."""
    if details.get("end_look") is None:
        return {}
    return {"end_look": details["end_look"], "settled_by": details.get("settled_by")}


def confirmation_text(conf: dict[str, Any], steps: tuple[StepView, ...] = ()) -> str:
    """One sentence on the fresh-launch confirmation of a hot search (driver.Confirmation);
    the search trial that was the confirmation is named by its step in the Trials table."""
    culprits = _set(conf["subset"])
    if conf.get("skipped"):
        return (f"fresh-launch confirmation skipped ({conf['skipped']}): {culprits} was found "
                "by hot-switched trials only")
    if conf.get("agrees") is None:
        return f"fresh-launch confirmation of {culprits} could not test"
    if conf["agrees"] and conf.get("by_trial") is not None:
        return (f"confirmed in a fresh launch: the good end with {culprits} on fails "
                f"({_trial_ref(conf['by_trial'], steps)} ran in an engine launched in that "
                "configuration and never switched)")
    if conf["agrees"]:
        return f"confirmed in a fresh launch: the good end with {culprits} on fails"
    return (f"DISAGREEMENT: the hot-switched trials name {culprits}, but the good end with "
            f"{culprits} on passes in a fresh launch; do not trust this culprit until a "
            "`--fresh-launches` bisect agrees")


def _trial_ref(trial_id: int, steps: tuple[StepView, ...]) -> str:
    """A ledger trial as the report's Trials table numbers it (its step), else by its ledger
    id (a trial reused from an earlier bisect that is not one of this table's steps)."""
    numbers = [s.step for s in steps if s.trial_id == trial_id]
    if numbers:
        return f"step {numbers[0]} of the search"
    return f"trial {trial_id} of the ledger, from an earlier run,"


def _md_neighbours(items: list[dict[str, Any]]) -> list[str]:
    if not items:
        return []
    out = ["## Passing and failing neighbours (diff-config)", ""]
    for item in items:
        if "note" in item:
            return out + [item["note"], ""]
        out += [f"{item['passing']} → {item['failing']}:", "",
                "| section | key | passing | failing |", "| --- | --- | --- | --- |"]
        out += [f"| {c['section']} | `{c['key']}` | {c['passing']} | {c['failing']} |"
                for c in item["changes"] if c["section"] != "fingerprint"]
        out.append("")
    return out


def _terminal_lines(view: BisectView) -> list[Line]:
    r, b = view.result, bound(view)
    lines: list[Line] = [(f"{r['status'].upper()}  {headline(view)}",
                          STYLES.get(r["status"], "bold red"))]
    drift = decided_on_drift(view)
    if drift:
        lines.append((drift, None))
    if r["status"] == "several":
        lines.append((f"posterior: {SEVERAL_NOTE}", "dim"))
    for t in r["top"][:3]:
        lines.append((f"  {t['posterior']:.3f}  {t['hypothesis']}", None))
    if r.get("remedy"):
        advice = remedy_advice(view)
        lines.append((f"bad end without the culprits: {remedy_text(view)}",
                      "bold yellow" if advice else None))
        if advice:
            lines.append((advice, "yellow"))
    conf = r.get("confirmation")
    if conf:
        lines.append((confirmation_text(conf, view.steps), "bold yellow"
                      if conf.get("agrees") is False
                      else None))
    text = (f"trials: {b['steps']} used, {b['launches']} launched, {b['reused']} reused from "
            f"the ledger (bound ≈ {b['trials_bound']})")
    lines.append((text, "dim"))
    lines.append(("reproduce (each trial as `dsv4bisect run` measures it, exiting as it was "
                  "counted):", "bold"))
    lines += [(f"  step {s.step}: {reproduce(view, s)}", None) for s in view.steps]
    lines += [(f"the culprit alone: {line}", "bold") for line in culprit_lines(view)]
    if view.relaunches:
        lines.append((relaunch_text(view), "yellow"))
    lines.append((f"run dir: {view.run_dir}", "dim"))
    return lines


# -- the public renderers: every output goes through the one redaction (dsv4bisect/redact.py) --
def _secrets(view: BisectView) -> set[str]:
    """Secrets the request carried (`--set ...X_TOKEN=v`) or a trial recorded."""
    return secrets_in(view.request) | secrets_in([s.details for s in view.steps])


def report_json(view: BisectView) -> dict[str, Any]:
    return redact(_report_json(view), _secrets(view))  # type: ignore[no-any-return]


def render_markdown(view: BisectView, plot_note: str | None = None) -> str:
    return redact_text(_render_markdown(view, plot_note), _secrets(view))


def terminal_lines(view: BisectView) -> list[Line]:
    secrets = _secrets(view)
    return [(redact_text(text, secrets), style) for text, style in _terminal_lines(view)]


def render_posterior(view: BisectView, path: Path) -> Path | None:
    """Posterior of the final top hypotheses after each trial; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig = posterior_figure(view)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def posterior_figure(view: BisectView) -> Any:
    """The posterior plot as a matplotlib Figure (matplotlib must be importable)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 3.6))
    # the posterior after step N sits at N, as the terminal and the Trials table number them;
    # the prior one to the left of the first step
    xs = [-1, *(s.step for s in view.steps)][:len(view.history)]
    for name in view.history[0] if view.history else {}:
        ax.plot(xs, [h[name] for h in view.history[:len(xs)]], marker="o", ms=3, label=name)
    ax.axhline(view.spec.confidence, ls="--", lw=0.8, color="grey",
               label=f"confidence {view.spec.confidence}")
    status = view.result["status"]
    title = (f"bisect several: {', '.join(ranked_culprits(view))}, each failing alone\n"
             "posterior of the single-set hypotheses (they cannot hold several culprits)"
             if status == "several" else
             f"bisect {status}: posterior of the top hypotheses")
    ax.set(xlabel="after step (numbered as the terminal and the Trials table number them)",
           ylabel="posterior", ylim=(0, 1.02))
    ax.set_title(title, fontsize=9)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are counted, never 0.5
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: "prior" if x == -1 else f"{x:g}"))
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1, 0.5))
    fig.tight_layout()
    return fig


def write_report(view: BisectView) -> dict[str, str | None]:
    """report.md, report.json and posterior.png in the run directory."""
    from dsv4bisect.report.heatmap import PLOTS_SKIPPED

    png = render_posterior(view, view.run_dir / PLOT)
    (view.run_dir / "report.md").write_text(
        render_markdown(view, None if png else PLOTS_SKIPPED))
    data = report_json(view)
    data["posterior_png"] = str(png) if png else None
    (view.run_dir / "report.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    return {"md": str(view.run_dir / "report.md"), "json": str(view.run_dir / "report.json"),
            "png": str(png) if png else None}
