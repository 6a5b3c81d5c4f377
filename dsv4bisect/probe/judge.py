"""The verdict rule (DESIGN §6, probe-anchors §6.4): paired against the baseline; losing facts fails.

1. A/A: baseline vs its repeat. A significantly lopsided A/A (two-sided exact McNemar
   p < ALPHA_AA) means the baseline is not stable: CANNOT_TEST.
2. Hard signatures (garbage, empty, runaway repetition, wrong last character) in the candidate
   on cases the baseline got right in both A/A runs, in >= 2 distinct seeds: FAIL at once.
3. Accuracy families with evidence (the baseline got at least 7 answers right — fewer can never
   reach significance): exact one-sided McNemar pooled over them, FAIL at p < 0.01; per cell
   (cell × arm) Holm-adjusted, FAIL at p_holm < 0.05. Families without evidence say so.
4. Drift (teacher-forced, candidate vs baseline) as a multiple of the good end's null model
   (its own variation when re-batched and served from its prefix cache: `probe/null.py`):
   WARN beyond the gate a harmless change passes at a 1 % false-alarm rate. Drift never FAILs:
   a FAIL is facts lost (rule 3), hard signatures (rule 2) or NaN/inf scores.
5. Otherwise PASS, provided something carried evidence; if nothing did, CANNOT_TEST.

Rows pair by (case_id, arm, concurrency level); every verdict also says under which conditions
each family ran (`conditions`) and the throughput per level (`throughput`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from dsv4bisect.errors import ConfigError
from dsv4bisect.probe import null
from dsv4bisect.probe import verdict as V
from dsv4bisect.probe.drift import compare, non_finite_cases, non_finite_reason, summarise
from dsv4bisect.probe.power import accuracy_power
from dsv4bisect.probe.run import ProbeRun, row_key
from dsv4bisect.probe.stats import holm, mcnemar_one_sided, mcnemar_two_sided
from dsv4bisect.probe.stats import min_significant_discordant as min_b

Pair = tuple[dict[str, Any], dict[str, Any], dict[str, Any]]  # baseline, repeat, candidate rows
_STANDIN = "_aa_standin"  # marks a baseline row standing in for a request the repeat skipped


def _pairs(base: ProbeRun, rep: ProbeRun | None, cand: ProbeRun, reasons: list[str]) -> list[Pair]:
    """Baseline/repeat/candidate rows by (case_id, arm). A request the repeat did not cover (a
    partial A/A, e.g. `dsv4bisect run`'s smoke subset) keeps its pair with the baseline row as
    its own repeat, marked `_STANDIN`; `_repeated` leaves those out of every A/A figure."""
    cand_rows, rep_rows = cand.rows_by_key(), rep.rows_by_key() if rep else {}
    pairs, missing, unrepeated = [], 0, 0
    for key, row in base.rows_by_key().items():
        if row["family"] == "drift":
            continue
        other = cand_rows.get(key)
        if other is None:
            missing += 1
            continue
        if rep is not None and key not in rep_rows:
            unrepeated += 1
            pairs.append((row, {**row, _STANDIN: True}, other))
        else:
            pairs.append((row, rep_rows.get(key, row), other))
    if missing:
        reasons.append(f"{missing} baseline requests have no counterpart in the candidate run")
    if unrepeated:
        reasons.append(f"the A/A repeat covers {len(pairs) - unrepeated} of {len(pairs)} "
                       "paired requests; the noise floor comes from those")
    return pairs


def _repeated(pairs: list[Pair]) -> list[Pair]:
    """Pairs whose repeat row is a real second run (not the baseline row standing in)."""
    return [p for p in pairs if not p[1].get(_STANDIN)]


def _families(pairs: list[Pair], has_repeat: bool) -> dict[str, V.FamilyResult]:
    grouped: dict[str, list[Pair]] = defaultdict(list)
    for p in pairs:
        grouped[p[0]["family"]].append(p)
    out = {}
    for fam, ps in grouped.items():
        n = len(ps)
        br = sum(bool(b["correct"]) for b, _, _ in ps)
        lost = sum(bool(b["correct"]) and not c["correct"] for b, _, c in ps)
        gained = sum(not b["correct"] and bool(c["correct"]) for b, _, c in ps)
        out[fam] = V.FamilyResult(
            fam, n, br / n, sum(bool(c["correct"]) for _, _, c in ps) / n,
            _repeat_accuracy(ps) if has_repeat else None, br, lost,
            gained,
            mcnemar_one_sided(lost, gained), br >= min_b(V.ALPHA_OVERALL))
    return out


def _repeat_accuracy(ps: list[Pair]) -> float | None:
    repeated = _repeated(ps)
    return sum(bool(r["correct"]) for _, r, _ in repeated) / len(repeated) if repeated else None


def _cells(pairs: list[Pair], families: set[str]) -> list[V.CellResult]:
    """Per cell × arm × concurrency level: a loss confined to one condition is its own cell."""
    grouped: dict[tuple[str, str, int], list[int]] = defaultdict(lambda: [0, 0, 0])
    for b, _, c in pairs:
        if b["family"] not in families:
            continue
        acc = grouped[(b["cell"], b["arm"], int(b.get("concurrency", 1)))]
        acc[0] += 1
        acc[1] += bool(b["correct"]) and not c["correct"]
        acc[2] += not b["correct"] and bool(c["correct"])
    keys = sorted(grouped)
    ps = [mcnemar_one_sided(grouped[k][1], grouped[k][2]) for k in keys]
    adj = holm(ps)
    return [V.CellResult(k[0], k[1], grouped[k][0], grouped[k][1], grouped[k][2], p, a,
                         a < V.ALPHA_CELL, k[2]) for k, p, a in zip(keys, ps, adj)]


def conditions(base: ProbeRun, cand: ProbeRun) -> dict[str, dict[str, Any]]:
    """Under which conditions each family ran, from the requests the two runs share: the arms,
    the concurrency levels, and the requests per (arm, level)."""
    cand_keys = set(cand.rows_by_key())
    out: dict[str, dict[str, Any]] = {}
    for row in base.rows:
        key = row_key(row)
        if key not in cand_keys:
            continue
        fam = out.setdefault(row["family"], {"arms": [], "concurrency": [], "requests": {}})
        label = f"{key[1]}@{key[2]}"
        fam["requests"][label] = fam["requests"].get(label, 0) + 1
    for fam in out.values():
        labels = [k.split("@") for k in fam["requests"]]
        fam["arms"] = sorted({a for a, _ in labels})
        fam["concurrency"] = sorted({int(c) for _, c in labels})
    return out


def throughput(base: ProbeRun, cand: ProbeRun) -> dict[str, Any]:
    """Requests/s and tokens/s per concurrency level of each configuration, as measured, and how
    each decoded (`decoding`: speculative decoding is a server setting, so the probe's greedy
    answers ran through it wherever the server had it)."""
    return {"baseline": dict(base.throughput), "candidate": dict(cand.throughput),
            "decoding": {"baseline": decoding(base), "candidate": decoding(cand)}}


def decoding(run: ProbeRun) -> str:
    """`greedy` or `greedy, speculative NEXTN (3 steps, top-k 1, 4 draft tokens)`, from the
    server's `/server_info` as the run recorded it (SGLang's argument names)."""
    info = (run.server or {}).get("info") or {}
    algo = info.get("speculative_algorithm") if isinstance(info, dict) else None
    if not algo:
        return "greedy"
    steps, topk, drafts = (info.get(k) for k in (
        "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"))
    return (f"greedy, speculative {algo} ({steps} steps, top-k {topk}, {drafts} draft "
            "tokens)")


def _signature_seeds(pairs: list[Pair], pick: int) -> dict[str, list[int]]:
    """Hard signatures of run `pick` (1 = repeat, 2 = candidate) where the baseline was stably
    right and showed no such signature itself."""
    seen: dict[str, set[int]] = defaultdict(set)
    for p in pairs:
        b, r = p[0], p[1]
        if not (b["correct"] and r["correct"]):
            continue
        for sig in set(p[pick].get("signatures") or ()) - set(b.get("signatures") or ()):
            seen[sig].add(int(b["seed"]))
    return {k: sorted(v) for k, v in sorted(seen.items())}


def drift_gate(kl: float, top1: float, aa_kl: float, aa_top1: float
               ) -> tuple[str, dict[str, float]]:
    """pass/warn of one view against its A/A floor: the rule when no null model was measured
    (a baseline collected without its null arms). Drift alone never FAILs."""
    gates = {"warn_kl": max(V.DRIFT_KL_AA_FACTOR_WARN * aa_kl, V.DRIFT_WARN_KL),
             "warn_top1": aa_top1 - V.DRIFT_WARN_TOP1_DROP}
    warn = kl > gates["warn_kl"] or top1 < gates["warn_top1"]
    return ("warn" if warn else "pass"), gates


def drift_check(base: ProbeRun, rep: ProbeRun | None, cand: ProbeRun) -> dict[str, Any]:
    """Drift as a multiple of the good end's null model in every view (`probe/null.py`); also
    used by the sequential trial probe. Without a null model, the A/A floor's gates."""
    ref = base.drift_by_case()
    cand_cmp = [compare(ref[d.case_id], d) for d in cand.drift if d.case_id in ref]
    rep_cmp = [compare(ref[d.case_id], d) for d in rep.drift if d.case_id in ref] if rep else []
    got, floor = summarise(cand_cmp), summarise(rep_cmp)
    if got is None:
        return {"status": "absent"}
    sizes = {null.ALL: got.n_positions, **{f"positions {k}": int(b["n"])
                                           for k, b in got.by_position.items()
                                           if b["n"] >= V.DRIFT_MIN_BUCKET}}
    answer = len(null.view_values(cand_cmp, null.ANSWER)[0])
    if answer >= null.ANSWER_MIN:
        sizes[null.ANSWER] = answer
    model = null.build(null.null_comparisons(base.drift, base.null), sizes,
                       seed=base.spec.seed_block)
    if model is None:
        views = [_floor_view(where, got, floor, cand_cmp) for where in sizes]
    else:
        views = [null.judge_view(model.views[where], *null.view_values(cand_cmp, where))
                 for where in sizes if where in model.views]
    rank = {"pass": 0, "warn": 1}
    worst = max(views, key=lambda v: (rank[v["status"]], v["severity"]))
    overall = next(v for v in views if v["where"] == null.ALL)
    return {"status": worst["status"], "trigger": worst, "candidate": got.to_dict(),
            "floor": floor.to_dict() if floor else None, "gates": worst["gates"],
            "null": model.to_dict() if model else None, "multiple": overall.get("multiple"),
            "views": {v["where"]: {k: v[k] for k in ("status", "kl_mean", "top1_agreement",
                                                     "multiple")} for v in views}}


def _floor_view(where: str, got: Any, floor: Any, cmp: list[Any]) -> dict[str, Any]:
    kl, same = null.view_values(cmp, where)
    fb = floor.by_position.get(where.removeprefix("positions ")) if floor else None
    aa_kl = fb["kl_mean"] if fb else (floor.kl_mean if floor else 0.0)
    aa_top1 = fb["top1_agreement"] if fb else (floor.top1_agreement if floor else 1.0)
    mean, top1 = sum(kl) / len(kl), sum(same) / len(same)
    status, gates = drift_gate(mean, top1, aa_kl, aa_top1)
    severity = max(mean / gates["warn_kl"], (aa_top1 - top1) / V.DRIFT_WARN_TOP1_DROP)
    return {"status": status, "where": where, "kl_mean": mean, "top1_agreement": top1,
            "multiple": None, "gates": gates, "severity": severity}


def _drift_reason(d: dict[str, Any]) -> str:
    t, g, c = d["trigger"], d["gates"], d["candidate"]
    first = (f"; first divergence at token {c['first_divergence']}"
             if c["first_divergence"] is not None else "")
    if d.get("null") is None:
        return (f"drift {d['status'].upper()} ({t['where']}): mean KL {t['kl_mean']:.3g} nats "
                f"(warn > {g['warn_kl']:.3g}), top-1 agreement {t['top1_agreement']:.2%} "
                f"(warn < {g['warn_top1']:.2%}); no null model was measured, so the gates are "
                f"the A/A floor's" + first)
    view = d["null"]["views"][t["where"]]
    return (f"drift {d['status'].upper()} ({t['where']}): mean KL {t['kl_mean']:.3g} nats, "
            f"{null.says(t['multiple'])} ({view['kl_mean']:.3g}, warn beyond "
            f"{_times(g['warn_multiple'])} at a {d['null']['false_alarm']:.0%} false-alarm "
            f"rate); top-1 agreement {t['top1_agreement']:.2%} (null {view['top1_agreement']:.2%}"
            f", warn < {g['warn_top1']:.2%}); {t['tail_share']:.2%} of positions past the "
            f"null's 99th-percentile KL (warn > {g['warn_tail']:.2%})" + first)


def _times(m: float | None) -> str:
    return "any drift" if m is None else f"×{m:.3g}"


def _check_specs(base: ProbeRun, rep: ProbeRun | None, cand: ProbeRun) -> None:
    specs = {(r.spec.spec_hash(), r.spec.seed_block) for r in (base, rep, cand) if r is not None}
    if len(specs) != 1:
        raise ConfigError("the runs to judge were collected with different probe specs",
                          "probe baseline, repeat and candidate with the same tier and seed block")


def _aa(pairs: list[Pair], rep: ProbeRun | None) -> dict[str, Any]:
    pairs = _repeated(pairs)
    aa_b = sum(bool(b["correct"]) and not r["correct"] for b, r, _ in pairs)
    aa_c = sum(not b["correct"] and bool(r["correct"]) for b, r, _ in pairs)
    return {"n": len(pairs), "flips": aa_b + aa_c, "b": aa_b, "c": aa_c,
            "p_value": mcnemar_two_sided(aa_b, aa_c), "repeat": rep is not None}


def _signature_rule(pairs: list[Pair], fails: list[str], reasons: list[str]) -> dict[str, Any]:
    sig_cand, sig_rep = _signature_seeds(pairs, 2), _signature_seeds(pairs, 1)
    n_cand = len({s for seeds in sig_cand.values() for s in seeds})
    n_rep = len({s for seeds in sig_rep.values() for s in seeds})
    hard = n_cand >= V.HARD_SIGNATURE_SEEDS and n_rep < V.HARD_SIGNATURE_SEEDS
    if hard:
        fails.append("hard signatures where the baseline was right: " + ", ".join(
            f"{k} (seeds {', '.join(map(str, v[:4]))}{'…' if len(v) > 4 else ''})"
            for k, v in sig_cand.items()))
    elif n_rep >= V.HARD_SIGNATURE_SEEDS:
        reasons.append("the A/A repeat itself shows hard signatures: signature rule suspended")
    return {"candidate": sig_cand, "repeat": sig_rep, "hard_fail": hard}


def _with_non_finite(signatures: dict[str, Any], cases: list[str]) -> dict[str, Any]:
    if not cases:
        return signatures
    return {**signatures, "non_finite": cases, "hard_fail": True}


def decide(base: ProbeRun, rep: ProbeRun | None, cand: ProbeRun) -> V.Verdict:
    """Apply the rule; the verdict carries every number it used."""
    _check_specs(base, rep, cand)
    reasons: list[str] = []
    fails: list[str] = []
    pairs = _pairs(base, rep, cand, reasons)
    probe = {"tier": base.spec.tier, "spec_hash": base.spec.spec_hash(),
             "seed_block": base.spec.seed_block,
             "probe_version": base.spec.to_dict()["probe_version"],
             "warmup_requests": base.spec.warmup_requests}
    if base.spec.warmup_requests:  # requests that come late (probe/warmup.py)
        reasons.append(f"each server answered a polluting phase of "
                       f"{base.spec.warmup_requests} requests of other conversations before "
                       "the measured ones (probe.warmup_requests)")
    aa = _aa(pairs, rep)
    serving = {"conditions": conditions(base, cand), "throughput": throughput(base, cand)}
    if rep is None:
        reasons.append("no A/A repeat: the noise floor is taken as zero")
    families = _families(pairs, rep is not None)
    with_evidence = {f for f, r in families.items() if r.evidence}
    cells = _cells(pairs, with_evidence)
    drift = drift_check(base, rep, cand)
    bad_ends = [(who, cases) for who, run in (("the baseline", base), ("the A/A repeat", rep))
                if run is not None and (cases := non_finite_cases(run.rows))]
    if bad_ends:  # the good end computed NaN/inf: no measurement of the candidate is possible
        return V.Verdict(V.CANNOT_TEST, (
            *(non_finite_reason(who, cases) for who, cases in bad_ends),
            "the good end is itself broken, so nothing can be compared with it", *reasons),
            probe, families=families, cells=tuple(cells), drift=drift, aa=aa)
    cand_non_finite = non_finite_cases(cand.rows)
    if cand_non_finite:
        fails.append(non_finite_reason("the candidate", cand_non_finite))
    if aa["p_value"] < V.ALPHA_AA:
        return V.Verdict(V.CANNOT_TEST, (
            f"the baseline disagrees with its own repeat ({aa['b']} lost, {aa['c']} gained, "
            f"p = {aa['p_value']:.2g}): no stable noise floor", *reasons), probe,
            families=families, cells=tuple(cells), drift=drift, aa=aa, **serving)
    signatures = _signature_rule(pairs, fails, reasons)
    overall = _overall(pairs, with_evidence, families, fails, reasons)
    fails += [f"cell {c.cell} ({c.arm}, concurrency {c.concurrency}): lost {c.b}, gained "
              f"{c.c}, Holm p = {c.p_holm:.2g}" for c in cells if c.failed]
    if drift["status"] != "absent":  # drift alone WARNs at most: losing facts is what fails
        reasons.append(_drift_reason(drift))
    power = accuracy_power(overall.get("baseline_right", 0), overall.get("baseline_accuracy"),
                           overall.get("b", 0))
    if fails:
        outcome = V.FAIL
    elif drift["status"] == "warn":
        outcome = V.WARN
    elif with_evidence or drift["status"] != "absent":
        outcome = V.PASS
        if with_evidence:
            reasons.insert(0, f"no significant loss; {power['statement']}")
    else:
        outcome = V.CANNOT_TEST
        reasons.insert(0, "no evidence: the baseline answered too few cases right and there "
                          "is no drift family")
    return V.Verdict(outcome, (*fails, *reasons), probe, families=families, overall=overall,
                     cells=tuple(cells), signatures=_with_non_finite(signatures, cand_non_finite),
                     drift=drift, aa=aa, power=power, **serving)


def _overall(pairs: list[Pair], with_evidence: set[str], families: dict[str, V.FamilyResult],
             fails: list[str], reasons: list[str]) -> dict[str, Any]:
    for fam, r in sorted(families.items()):
        if not r.evidence:
            reasons.append(f"{fam}: no evidence (baseline right in {r.baseline_right}/{r.n}; "
                           f"at least {min_b(V.ALPHA_OVERALL)} needed)"
                           + ("; drift decides" if not with_evidence else ""))
    used = [p for p in pairs if p[0]["family"] in with_evidence]
    if not used:
        return {"n": 0, "b": 0, "c": 0, "p_value": 1.0, "alpha": V.ALPHA_OVERALL, "families": []}
    b = sum(bool(x["correct"]) and not c["correct"] for x, _, c in used)
    c_ = sum(not x["correct"] and bool(c["correct"]) for x, _, c in used)
    right = sum(bool(x["correct"]) for x, _, _ in used)
    p = mcnemar_one_sided(b, c_)
    if p < V.ALPHA_OVERALL:
        fails.append(f"accuracy: lost {b}, gained {c_} of {len(used)} paired answers "
                     f"(exact McNemar p = {p:.2g} < {V.ALPHA_OVERALL})")
    return {"n": len(used), "b": b, "c": c_, "p_value": p, "alpha": V.ALPHA_OVERALL,
            "families": sorted(with_evidence), "baseline_right": right,
            "baseline_accuracy": right / len(used),
            "candidate_accuracy": sum(bool(c["correct"]) for _, _, c in used) / len(used)}
