"""A run's report, rendered from the files of its run directory (pure: no engine, no probe).

`load_run(dir)` reads run.json, verdict.json and both arms' config.json; `render_markdown` gives
report.md; `terminal_lines` gives the short summary a terminal shows, as (text, style) pairs so
that this module needs no Rich (the CLI prints them). `dsv4bisect report RUN_DIR` re-renders any
of the three from the same files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dsv4bisect.base.bounded import json_object, load_json
from dsv4bisect.errors import ConfigError
from dsv4bisect.probe.conditions import family_conditions, throughput_lines
from dsv4bisect.probe.verdict import Verdict
from dsv4bisect.redact import redact, redact_text, secrets_in
from dsv4bisect.report import shapes
from dsv4bisect.report.commands import (
    bisect_command,
    exit_words,
    next_step,
    patch_label,
    reproduce_command,
)
from dsv4bisect.report.run_view import RunView

Line = tuple[str, "str | None"]  # text, style name (None: plain)
STYLES = {"PASS": "bold green", "FAIL": "bold red", "WARN": "bold yellow",
          "CANNOT_TEST": "bold magenta"}
ARMS = ("baseline", "candidate")


def load_run(run_dir: str | Path) -> RunView:
    """Read a run directory written by `dsv4bisect run`; anything else is a ConfigError."""
    root = Path(run_dir)
    hint = "pass a directory written by `dsv4bisect run`"
    if not root.is_dir():
        raise ConfigError(f"`{root}` is not a run directory", hint)
    if not (root / "run.json").is_file():
        raise ConfigError(f"`{root}` is not a run directory (no run.json)", hint)
    run = json_object(load_json(root / "run.json", "run"), str(root / "run.json"),
                      "a run record", hint)
    if run.get("schema") != "dsv4bisect.run/1":
        raise ConfigError(f"`{root}` holds a {str(run.get('schema'))[:40]!r} document, not a run",
                          "`dsv4bisect report` reads directories written by `dsv4bisect run`")
    shapes.check(run, shapes.RUN, str(root / "run.json"))
    shapes.check_items(run.get("arms") or {}, shapes.ARM, str(root / "run.json"), "arms")
    verdict = None
    if (root / "verdict.json").exists():
        verdict = _load_verdict(root / "verdict.json")
    elif run.get("status") == "done" or run.get("verdict") is not None:
        # A finished run without its verdict: reporting "DONE" (exit 0) would read as success.
        raise ConfigError(f"`{root}`: run.json says the run finished "
                          f"({str(run.get('verdict'))[:20]}), but verdict.json is missing",
                          "the run directory was damaged; re-run `dsv4bisect run` (the "
                          "command is in run.json)")
    configs = {}
    for arm in ARMS:
        path = root / arm / "config.json"
        if path.exists():
            configs[arm] = json_object(load_json(path, "run"), str(path), "a resolved config",
                                       hint)
    return RunView(root, run, verdict, configs, frozenset(secrets_in([run, configs])))


def _load_verdict(path: Path) -> Verdict:
    shown = str(path)
    data = json_object(load_json(path, "run"), shown, "a verdict",
                       "the file was edited or truncated; `dsv4bisect run` writes it again")
    shapes.check(data, shapes.VERDICT, shown)
    shapes.check_items(data.get("families", {}), shapes.FAMILY, shown, "families")
    shapes.check_items(data.get("cells", []), shapes.CELL, shown, "cells")
    shapes.check_items(data.get("reasons", []), str, shown, "reasons")
    try:
        verdict = Verdict.from_dict(data)
        verdict.exit_code  # an unknown verdict name fails here, not in a renderer
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"`{shown}` is not a verdict: {str(exc)[:80]}",
                          "the file was edited or truncated; `dsv4bisect run` writes it again"
                          ) from None
    return verdict


def verdict_json(view: RunView) -> dict[str, Any]:
    """The verdict JSON (`--json`), or the run's status when it has no verdict."""
    return redact(_verdict_json(view), view.secrets)  # type: ignore[no-any-return]


def _verdict_json(view: RunView) -> dict[str, Any]:
    if view.verdict is not None:
        return view.verdict.to_dict()
    return {"verdict": None, "status": view.status, "exit_code": view.run.get("exit_code"),
            "error": view.run.get("error")}


# -- small formatting helpers -------------------------------------------------------------------
def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _num(x: Any, fmt: str = ".3g") -> str:
    return "-" if x is None else format(x, fmt)


def _patches(arm: dict[str, Any]) -> str:
    faults, inert = set(arm.get("faults") or ()), set(arm.get("inert") or ())
    out = []
    for name, variant in (arm.get("patch_set") or {}).items():
        item = patch_label(name, variant)
        item += (" †" if name in faults else "") + (" (inert)" if name in inert else "")
        out.append(item)
    return ", ".join(out) or "none"


def _headline(view: RunView) -> str:
    if view.verdict is not None:
        return view.verdict.verdict
    return {"interrupted": "INTERRUPTED", "error": "ERROR"}.get(view.status, view.status.upper())


# -- terminal -----------------------------------------------------------------------------------
def terminal_lines(view: RunView) -> list[Line]:
    """The summary a terminal shows after a run (and `dsv4bisect report` without flags)."""
    return [(redact_text(text, view.secrets), style) for text, style in _terminal_lines(view)]


def _terminal_lines(view: RunView) -> list[Line]:
    run, v = view.run, view.verdict
    head = _headline(view)
    probe = run.get("probe") or {}
    wall = run.get("wall_s")
    lines: list[Line] = [(f"{head}  {run.get('profile')} ({probe.get('tier')} tier, spec "
                          f"{probe.get('spec_hash')}, seed block {probe.get('seed_block')}"
                          + (f", {wall:.0f} s" if isinstance(wall, (int, float)) else "") + ")",
                          STYLES.get(head, "bold"))]
    arms = run.get("arms") or {}
    for arm in ARMS:
        a = arms.get(arm) or {}
        cached = " (cached baseline)" if a.get("cached") else ""
        lines.append((f"  {arm:<9} {_patches(a)}  [{a.get('fingerprint')}]{cached}", None))
    if v is not None:
        lines += _terminal_verdict(v)
    elif run.get("error"):
        lines.append((f"  error: {run['error'].get('message')}", "red"))
    lines.append((f"run dir: {view.run_dir}", "dim"))
    step = next_step(view)
    if step is not None:
        lines.append((step, "bold"))
    return lines


def _terminal_verdict(v: Verdict) -> list[Line]:
    out: list[Line] = []
    for fam, r in v.families.items():
        acc = f"{_pct(r.baseline_accuracy)} → {_pct(r.candidate_accuracy)}"
        text = (f"  {fam:<9} {acc:<12} n={r.n:<4} lost {r.b}, gained {r.c}, "
                f"p={r.p_value:.2g}{'' if r.evidence else '  (no evidence)'}")
        out.append((text, None))
        if v.conditions:
            out.append((f"            ran {family_conditions(v.conditions.get(fam))}", "dim"))
    cand = (v.drift or {}).get("candidate")
    if cand:
        text = (f"  drift     {v.drift['status']}: mean KL {cand['kl_mean']:.3g} nats, top-1 "
                f"agreement {cand['top1_agreement']:.2%} over {cand['n_positions']} "
                f"positions of {cand['n_cases']} transcripts")
        out.append((text, None))
        if v.drift.get("null"):
            out.append(((f"            {_multiple(v.drift.get('multiple'))} the good end's own "
                         "variation (re-batched, re-chunked)"), None))
        if v.conditions:
            out.append((f"            ran {family_conditions(v.conditions.get('drift'))}",
                        "dim"))
    out += [(f"  {line}", "dim") for line in throughput_lines(v.throughput)]
    for reason in v.reasons:
        first, _, rest = reason.partition("\n")
        out.append((f"  - {first}", None))
        out += [(f"    {line}", "dim") for line in rest.splitlines()]
    return out


# -- markdown -----------------------------------------------------------------------------------
def render_markdown(view: RunView) -> str:
    """report.md: the verdict, both configurations, accuracy, drift, crashes, timing, files."""
    return redact_text(_render_markdown(view), view.secrets)


def _render_markdown(view: RunView) -> str:
    parts = [_md_head(view), _md_reasons(view), _md_configs(view)]
    v = view.verdict
    if v is not None:
        parts += [_md_families(v), _md_drift(v), _md_cells(v), _md_signatures(v), _md_aa(view, v),
                  _md_power(v)]
    parts += [_md_crashes(view), _md_timing(view), _md_files(view), _md_reproduce(view)]
    return "\n\n".join(p for p in parts if p) + "\n"


def _md_head(view: RunView) -> str:
    run, probe = view.run, view.run.get("probe") or {}
    versions = run.get("versions") or {}
    wall = run.get("wall_s")
    return "\n".join([
        f"# dsv4bisect run: {_headline(view)}",
        "",
        (f"- profile `{run.get('profile')}`, tier `{probe.get('tier')}` (spec "
         f"`{probe.get('spec_hash')}`, seed block {probe.get('seed_block')}, families "
         f"{', '.join(probe.get('families') or [])})"),
        f"- {exit_words(view)}; status `{view.status}`; started {run.get('started_at')}, "
        f"finished {run.get('finished_at')}"
        + (f", wall time {wall:.1f} s" if isinstance(wall, (int, float)) else ""),
        (f"- dsv4bisect {versions.get('dsv4bisect')}, probe version "
         f"{versions.get('probe_version')}, Python {versions.get('python')}"),
    ])


def _md_reasons(view: RunView) -> str:
    v = view.verdict
    if v is None:
        err = view.run.get("error") or {}
        if not err:
            return ""
        return f"## Error\n\n```\n{err.get('message')}\n```" + (
            f"\n\nhint: {err['hint']}" if err.get("hint") else "")
    lines = [f"## Verdict: {v.verdict}", ""]
    for reason in v.reasons:
        first, _, rest = reason.partition("\n")
        lines += [f"- {first}", *_md_block(rest)]
    return "\n".join(lines)


def _md_block(text: str) -> list[str]:
    """A log tail under a list item, fenced."""
    if not text.strip():
        return []
    return ["", "  ```", *[f"  {line}" for line in text.splitlines()], "  ```", ""]


def _md_configs(view: RunView) -> str:
    arms = view.run.get("arms") or {}
    rows = [("patches", _patches), ("fingerprint", lambda a: f"`{a.get('fingerprint')}`"),
            ("engine kind", lambda a: str(a.get("kind"))),
            ("launch attempts", lambda a: str(a.get("attempts"))),
            ("ready after (s)", lambda a: ", ".join(f"{s:.1f}" for s in a.get("launch_s") or [])
             or "-"),
            ("crashes", lambda a: str(len(a.get("crashes") or [])))]
    out = ["## Configurations", "", "| | good end (baseline) | candidate |", "| --- | --- | --- |"]
    for label, get in rows:
        out.append(f"| {label} | {get(arms.get('baseline') or {})} | "
                   f"{get(arms.get('candidate') or {})} |")
    cached = (arms.get("baseline") or {}).get("cached")
    out.append("")
    if cached:
        out.append(f"The baseline was reused from the cache (`{cached['path']}`, made "
                   f"{cached['created_at']}); `--no-cache` measures it again.")
    elif view.status == "done":
        out.append("The baseline was measured in this run; the candidate ran on its own engine.")
    if any((arms.get(a) or {}).get("faults") for a in ARMS):
        out.append("† fault variant (reproduces a known failure mode).")
    if any((arms.get(a) or {}).get("inert") for a in ARMS):
        out.append("(inert): cannot change anything on this engine (see `dsv4bisect patches "
                   "show NAME`).")
    return "\n".join(out)


def _md_families(v: Verdict) -> str:
    if not v.families:
        return ""
    out = ["## Accuracy", "",
           ("| family | conditions (arm@concurrency ×requests) | n | baseline | candidate "
            "| A/A repeat | lost | gained | p (McNemar) | evidence |"),
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for fam, r in v.families.items():
        out.append(f"| {fam} | {family_conditions(v.conditions.get(fam))} | {r.n} | "
                   f"{_pct(r.baseline_accuracy)} | "
                   f"{_pct(r.candidate_accuracy)} | {_pct(r.repeat_accuracy)} | {r.b} | {r.c} | "
                   f"{r.p_value:.3g} | {'yes' if r.evidence else 'no'} |")
    if "drift" in v.conditions:
        out.append(f"\nDrift transcripts ran {family_conditions(v.conditions['drift'])} "
                   "(teacher-forced, alone, from an empty cache).")
    rates = throughput_lines(v.throughput)
    if rates:
        out += ["", "Throughput per concurrency level (scored requests; a warm arm's replay "
                "requests are not counted):", ""] + [f"- {line}" for line in rates]
    o = v.overall
    if o.get("n"):
        out.append(f"\nPooled over {', '.join(o.get('families', []))}: lost {o['b']}, gained "
                   f"{o['c']} of {o['n']}, p = {o['p_value']:.3g} (FAIL below {o['alpha']}).")
    out.append("\nAccuracy by length × depth (baseline, candidate, difference): `heatmap.png`.")
    return "\n".join(out)


def _multiple(m: float | None) -> str:
    return "any drift above an exact-zero" if m is None else f"×{m:.3g}"


def _md_null(d: dict[str, Any]) -> list[str]:
    """The null model's row per view: the good end's own variation it was judged against."""
    model = d.get("null")
    if not model:
        return ["", ("No null model was measured with this baseline: the gates are the A/A "
                     "floor's.")]
    arms = ", ".join(f"{a} ({n} positions)" for a, n in model["arms"].items())
    out = ["", (f"Null model (the good end re-scored: {arms}); the candidate is "
                f"**{_multiple(d.get('multiple'))}** the deployment's own variation at all "
                f"positions. False-alarm rate {model['false_alarm']:.0%} over "
                f"{model['tests']} tests."), "",
           "| view | null mean KL (95 % interval) | null top-1 | WARN above | WARN below top-1 |",
           "| --- | ---: | ---: | ---: | ---: |"]
    for where, v in model["views"].items():
        lo, hi = v["kl_mean_ci"]
        out.append(f"| {where} | {_num(v['kl_mean'])} ({_num(lo)}–{_num(hi)}) | "
                   f"{v['top1_agreement']:.2%} | {_num(v['warn_kl'])} "
                   f"({_multiple(v['warn_multiple'])}) | {v['warn_top1']:.2%} |")
    return out


def _md_drift(v: Verdict) -> str:
    d = v.drift or {}
    cand = d.get("candidate")
    if not cand:
        return ""
    floor = d.get("floor") or {}
    out = ["## Drift (teacher-forced)", "",
           f"Status **{d.get('status')}**" + (f", decided at {d['trigger']['where']}"
                                              if d.get("trigger") else "") + ".", "",
           ("| | transcripts | positions | mean KL | p99 KL | max KL | top-1 agreement "
            "| first divergence |"),
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, s in (("candidate vs baseline", cand), ("A/A floor", floor)):
        if s:
            out.append(f"| {label} | {s['n_cases']} | {s['n_positions']} | {_num(s['kl_mean'])} "
                       f"| {_num(s['kl_p99'])} | {_num(s['kl_max'])} | "
                       f"{s['top1_agreement']:.2%} | {_num(s['first_divergence'], '')} |")
    g = d.get("gates") or {}
    if g:
        out.append(f"\nWARN gates (drift never fails): mean KL > {_num(g['warn_kl'])}"
                   + (f" ({_multiple(g['warn_multiple'])} the null)"
                      if "warn_multiple" in g else "")
                   + f"; top-1 agreement < {g['warn_top1']:.2%}.")
    out += _md_null(d)
    out += ["", "| positions | n | mean KL | top-1 agreement | NLL baseline | NLL candidate |",
            "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for bucket, b in (cand.get("by_position") or {}).items():
        out.append(f"| {bucket} | {b['n']} | {_num(b['kl_mean'])} | {b['top1_agreement']:.2%} | "
                   f"{b['nll_ref']:.3f} | {b['nll_other']:.3f} |")
    return "\n".join(out)


def _md_cells(v: Verdict) -> str:
    failed = [c for c in v.cells if c.failed]
    if not failed:
        return ""
    out = ["## Failing cells", "",
           "| cell | arm | concurrency | n | lost | gained | p | Holm p |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    out += [f"| {c.cell} | {c.arm} | {c.concurrency} | {c.n} | {c.b} | {c.c} | "
            f"{c.p_value:.3g} | {c.p_holm:.3g} |" for c in failed]
    return "\n".join(out)


def _md_signatures(v: Verdict) -> str:
    sigs = (v.signatures or {}).get("candidate") or {}
    if not sigs:
        return ""
    out = ["## Hard signatures (candidate, where the baseline was right)", ""]
    out += [f"- `{name}` in seeds {', '.join(map(str, seeds))}" for name, seeds in sigs.items()]
    return "\n".join(out)


def _md_aa(view: RunView, v: Verdict) -> str:
    aa, meta = v.aa or {}, view.run.get("aa") or {}
    if not aa:
        return ""
    text = (f"## A/A noise floor\n\n{aa.get('n')} repeated accuracy requests, {aa.get('flips')} "
            f"flips (lost {aa.get('b')}, gained {aa.get('c')}), two-sided p = "
            f"{_num(aa.get('p_value'))}.")
    if not aa.get("repeat"):
        text += " There was no repeat: the floor is taken as zero."
    if meta.get("subset"):
        text += f" {meta['subset']}."
    return text


def _md_power(v: Verdict) -> str:
    statement = (v.power or {}).get("statement")
    return f"## Power\n\n{statement}." if statement else ""


def _md_crashes(view: RunView) -> str:
    out = []
    for arm in ARMS:
        for c in ((view.run.get("arms") or {}).get(arm) or {}).get("crashes") or ():
            when = "while starting" if c["phase"] == "start" else "while being probed"
            out += [(f"- {arm}, attempt {c['attempt']}: `{c['role']}` exited with code "
                     f"{c['returncode']} {when} (log `{c['log_path']}`)"),
                    *_md_block(str(c["log_tail"]))]
    return "## Crashes\n\n" + "\n".join(out).rstrip() if out else ""


def _md_timing(view: RunView) -> str:
    t = view.run.get("timing") or {}
    names = (("baseline_s", "baseline probe (incl. launch)"),
             ("repeat_s", "A/A repeat"), ("candidate_s", "candidate probe (incl. launch)"),
             ("report_s", "heatmap and report"))
    rows = [f"| {label} | {t[k]:.1f} |" for k, label in names if isinstance(t.get(k), (int, float))]
    if not rows:
        return ""
    wall = view.run.get("wall_s")
    if isinstance(wall, (int, float)):
        rows.append(f"| **wall time** | {wall:.1f} |")
    how = ("The candidate's engine started with the good end's, and the A/A repeat ran beside "
           "the candidate's probe (two engines, one core each)." if t.get("overlapped")
           else "One engine at a time.")
    return "\n".join(["## Timing", "", "| stage | seconds |", "| --- | ---: |", *rows, "", how])


FILES = (("run.json", "what was asked, versions, timestamps, timing"),
         ("verdict.json", "the verdict with its evidence (schema dsv4bisect.verdict/1)"),
         ("heatmap.png", "accuracy by length × depth: baseline, candidate, difference"),
         ("baseline/", "good end: config.json, logs/, receipts/, probe rows"),
         ("baseline-repeat/", "the A/A repeat's probe rows"),
         ("candidate/", "candidate: config.json, logs/, receipts/, probe rows"))


def _md_files(view: RunView) -> str:
    present = [f"- `{n}`: {what}" for n, what in FILES if (view.run_dir / n).exists()]
    return "## Files\n\n" + "\n".join(present) if present else ""


def _md_reproduce(view: RunView) -> str:
    text = f"## Reproduce\n\n```\n{reproduce_command(view.run)}\n```"
    command = bisect_command(view)
    if command is not None:
        text += (f"\n\n## Next step\n\nWhich of the candidate's patches did it "
                 f"(docs/bisect.md):\n\n```\n{command}\n```")
    return text
