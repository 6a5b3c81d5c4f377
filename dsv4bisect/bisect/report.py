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
from dsv4bisect.bisect.ledger import Ledger
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
    with Ledger.open_readonly(info["ledger"]) as ledger:  # a report writes nothing
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
                      tuple(views), len(rows), history, str(info["ledger"]),
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
    """The command that asks one trial's question again."""
    cmd = view.request.get("test_cmd")
    if cmd:
        from dsv4bisect.bisect.trials.testcmd import TestCommandRunner

        try:
            wire = TestCommandRunner(cmd).wire(step.patches)
        except Dsv4BisectError:  # a registry that no longer knows a name
            wire = ",".join(f"{n}:{v}" for n, v in step.patches.items())
        return (f"DSV4BISECT_PATCHES={shlex.quote(wire)} "
                f"DSV4BISECT_SEED_BLOCK={step.seed_block} {cmd}")
    return str(step.details.get("command") or "-")


def _report_json(view: BisectView) -> dict[str, Any]:
    return {
        "schema": REPORT_SCHEMA, "run_id": view.run_id, "run_dir": str(view.run_dir),
        "status": view.result["status"], "culprits": view.result.get("culprits"),
        "posterior": view.result.get("posterior"), "message": view.result.get("message"),
        "top": view.result.get("top"), "checks": view.result.get("checks"),
        "remedy": view.result.get("remedy"), "confirmation": view.result.get("confirmation"),
        "request": view.request, "settings": view.spec.to_json(), "ledger": view.ledger,
        "bound": bound(view),
        "relaunches": {"count": len(view.relaunches), "why": list(view.relaunches)},
        "trials": [{"step": s.step, "subset": list(s.subset), "patches": s.patches,
                    "seed_block": s.seed_block, "verdict": s.verdict, "outcome": s.outcome,
                    "signature": s.signature, "source": s.source, "attempts": s.attempts,
                    "duration_s": s.duration_s, "scores": _scores(s.details),
                    "baseline_cached": s.details.get("baseline_cached"),
                    "mode": s.details.get("mode"), "fresh_launch": s.details.get("fresh_launch"),
                    "requests": s.details.get("requests"), "node": _node(s.details),
                    "trial_run_dir": s.details.get("run_dir"), "ledger_trial": s.trial_id,
                    "reproduce": reproduce(view, s)} for s in view.steps],
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
    head = (f"culprit {_set(r['culprits'])} (posterior {r['posterior']:.3f})"
            if r["status"] == "found" else r["message"])
    lines = [f"# dsv4bisect bisect: {r['status']} — {head}", ""]
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
              r["message"], "", "| hypothesis | posterior |", "| --- | --- |"]
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
              ("| step | switched to bad | seed block | verdict | outcome | signature | scores "
               "| requests | mode | duration | source |"),
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in view.steps:
        dur = f"{s.duration_s:.1f} s" if s.duration_s is not None else "-"
        cached = " (baseline cached)" if s.details.get("baseline_cached") else ""
        lines.append(f"| {s.step} | {_set(s.subset)} | {s.seed_block} | {s.verdict or '-'} | "
                     f"{s.outcome} | {s.signature or '-'} | {_score_text(s.details)} | "
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
    lines += ["## Reproduce", ""]
    lines += [f"- step {s.step}: `{reproduce(view, s)}`" for s in view.steps]
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
    its own configuration (a fresh launch's measurement)."""
    mode = details.get("mode", "fresh")
    return "hot, launched" if mode == "hot" and details.get("fresh_launch") else mode


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
    lines: list[Line] = [(f"{r['status'].upper()}  {r['message']}",
                          STYLES.get(r["status"], "bold red"))]
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
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 3.6))
    xs = list(range(len(view.history)))  # 0: the prior
    for name in view.history[0] if view.history else {}:
        ax.plot(xs, [h[name] for h in view.history], marker="o", ms=3, label=name)
    ax.axhline(view.spec.confidence, ls="--", lw=0.8, color="grey",
               label=f"confidence {view.spec.confidence}")
    ax.set(xlabel="trials (0: prior)", ylabel="posterior", ylim=(0, 1.02),
           title=f"bisect {view.result['status']}: posterior of the top hypotheses")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # trials are counted, never 0.5
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
