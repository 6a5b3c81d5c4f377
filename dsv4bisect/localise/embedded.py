"""`localise` on the embedded engine, in-process: both configurations teacher-forced on the same
tokens, every site captured, judged against the good end's own envelope; then the state a
prefix-cache hit restores, and the speculative rounds.

One engine per checkpoint, precision, MoE backend and speculation is loaded and switched between
patch sets (`ReferenceEngine.switch` equals a fresh load with the other set). Runs, in order:
the good end (kept), its null arms (each compared with it at once and dropped), the bad end
(kept: its tensors go into the report).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dsv4bisect.localise import ops
from dsv4bisect.localise import protocol as P
from dsv4bisect.localise.capture import recording
from dsv4bisect.localise.cases import CaseTokens, prompt_ids, tier_cases
from dsv4bisect.localise.judge import Localisation, localise, null_comparisons
from dsv4bisect.localise.settings import EmbeddedSettings
from dsv4bisect.localise.sites import Capture, Compared
from dsv4bisect.localise.speculation import Round, first_wrong_round
from dsv4bisect.localise.state import hit_state, state_capture
from dsv4bisect.probe.spec import ProbeSpec

Progress = Callable[[str], None]


@dataclass
class EmbeddedResult:
    transcripts: list[P.Transcript]
    good: Capture
    bad: Capture
    activations: Localisation
    null_arms: tuple[str, ...]
    restore: Localisation | None = None  # the prefix-cache restore check (None: not run)
    restore_states: tuple[Capture, Capture] | None = None  # the bad end's cold and hit states
    spec: Round | None = None
    spec_prompts: int = 0  # prompts the speculative check generated
    seconds: dict[str, float] = field(default_factory=dict)


class Engines:
    """Loaded engines by what a patch switch cannot change."""

    def __init__(self) -> None:
        self._loaded: dict[tuple[Any, ...], Any] = {}

    def get(self, s: EmbeddedSettings) -> Any:
        from dsv4bisect.reference.engine import ReferenceEngine

        engine = self._loaded.get(s.load_key)
        if engine is None:
            engine = ReferenceEngine.load(s.directory, patches=s.patches,
                                          moe_backend=s.moe_backend, precision=s.precision,
                                          chunk_size=s.chunk_size, device=s.device,
                                          threads=s.threads, mtp=s.speculative is not None)
            self._loaded[s.load_key] = engine
        elif dict(engine.numerics.patches) != s.patches:
            engine.switch(s.patches)
        return engine


def spec_settings(s: EmbeddedSettings) -> Any:
    from dsv4bisect.reference.spec_settings import SpecSettings

    if s.speculative is None:
        return None
    sp = s.speculative
    return SpecSettings.resolve(str(sp.get("algorithm", "NEXTN")), sp.get("num_steps"),
                                sp.get("eagle_topk"), sp.get("num_draft_tokens"))


def drift_transcripts(engines: Engines, good: EmbeddedSettings, spec: ProbeSpec, n: int,
                      progress: Progress) -> list[CaseTokens]:
    """The tier's drift cases, longest first, `n` of them: prompt + the good end's greedy
    answer, as the probe's drift transcripts are made."""
    engine = engines.get(good)
    a = engine.config
    cases = [c for c in tier_cases(spec, a.compress_ratios[:a.num_hidden_layers],
                                   a.sliding_window) if c.family == "drift"]
    out = []
    for case in sorted(cases, key=lambda c: -c.prompt_tokens)[:n]:
        progress(f"drift transcript {case.case_id}: the good end's greedy answer")
        ids = prompt_ids(case)
        gen = engine.generate(list(ids), max_new_tokens=case.max_tokens)
        out.append(CaseTokens(case.case_id, ids, tuple(gen.output_ids), "drift transcript"))
    return out


def accuracy_prompts(engine: Any, spec: ProbeSpec) -> list[tuple[str, tuple[int, ...], int]]:
    a = engine.config
    return [(c.case_id, prompt_ids(c), c.max_tokens)
            for c in tier_cases(spec, a.compress_ratios[:a.num_hidden_layers], a.sliding_window)
            if c.family != "drift"]


def _capture(engine: Any, transcripts: Sequence[P.Transcript], arm: P.Arm, chunk: int
             ) -> tuple[Capture, dict[int, Any]]:
    """One protocol run, recorded; and each sequence's cache at the end of its prompt."""
    with recording(engine.model) as rec:
        forks = P.run(engine.model, transcripts, P.schedule(transcripts, arm, chunk), rec)
    return rec.capture, forks


def run_embedded(good: EmbeddedSettings, bad: EmbeddedSettings, cases: Sequence[CaseTokens],
                 *, spec_prompts: Sequence[tuple[str, tuple[int, ...], int]] = (),
                 arms: Sequence[P.Arm] = P.NULL_ARMS, engines: Engines | None = None,
                 progress: Progress = lambda _: None) -> EmbeddedResult:
    """Localise `bad` against `good` on `cases` (see the module doc). `spec_prompts`: more
    prompts for the speculative check after the cases' own."""
    engines = engines or Engines()
    seconds: dict[str, float] = {}
    transcripts = P.with_mates([P.Transcript(c.case_id, c.ids, len(c.prompt)) for c in cases])
    held = held_out(transcripts, arms, good, bad)

    t0 = time.perf_counter()
    progress(f"good end: {len(transcripts)} sequences, {sum(len(t.ids) for t in transcripts)} "
             "tokens, teacher-forced")
    g_engine = engines.get(good)
    g_cap, g_cold = _capture(g_engine, transcripts, P.BASE, good.chunk_size)
    null: dict[str, list[tuple[str, Compared]]] = {}
    arm_cold: dict[str, dict[int, Any]] = {}
    for arm in held:
        progress(f"good end, null arm {arm.name}")
        cap, cold = _capture(engines.get(good), transcripts, arm, good.chunk_size)
        for key, pair in null_comparisons(g_cap, arm.name, cap).items():
            null.setdefault(key, []).append(pair)
        arm_cold[arm.name] = cold
        del cap
    seconds["good_and_null"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    progress("bad end, teacher-forced")
    b_engine = engines.get(bad)
    b_cap, b_cold = _capture(b_engine, transcripts, P.BASE, bad.chunk_size)
    seconds["bad"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    progress("judging every site against its envelope")
    activations = localise(g_cap, b_cap, null)
    seconds["judge"] = time.perf_counter() - t0
    result = EmbeddedResult(transcripts, g_cap, b_cap, activations,
                            tuple(a.name for a in held), seconds=seconds)

    if bad.radix_cache:
        t0 = time.perf_counter()
        progress("state: the prefix-cache restore against the cold prefill")
        result.restore, result.restore_states = _restore_check(
            engines, good, bad, transcripts, g_cold, b_cold, arm_cold)
        seconds["state"] = time.perf_counter() - t0
    if bad.speculative is not None:
        t0 = time.perf_counter()
        progress("speculation: each round against greedy decoding")
        engine = engines.get(bad)
        prompts = [(t.case_id, t.ids[:t.prompt], max(1, len(t.ids) - t.prompt))
                   for t in transcripts if not t.case_id.endswith("#mate")] + list(spec_prompts)
        result.spec, result.spec_prompts = first_wrong_round(
            engine, prompts, chunk=bad.chunk_size, spec=spec_settings(bad),
            stop_ids=frozenset({engine.config.eos_token_id}))
        seconds["speculation"] = time.perf_counter() - t0
    return result


def held_out(transcripts: Sequence[P.Transcript], arms: Sequence[P.Arm],
             good: EmbeddedSettings, bad: EmbeddedSettings) -> list[P.Arm]:
    """The null arms that are not the change under test: an arm whose forwards are the bad
    end's is left out of the envelope, so a harmless change is judged against the others (a
    held-out envelope), never against itself."""
    theirs = P.schedule(transcripts, P.BASE, bad.chunk_size)
    return [a for a in arms if P.schedule(transcripts, a, good.chunk_size) != theirs]


def _restore_check(engines: Engines, good: EmbeddedSettings, bad: EmbeddedSettings,
                   transcripts: Sequence[P.Transcript], g_cold: dict[int, Any],
                   b_cold: dict[int, Any], arm_cold: dict[str, dict[int, Any]]
                   ) -> tuple[Localisation, tuple[Capture, Capture]]:
    from dsv4bisect.reference.scheduler import Scheduler

    seqs = [(seq, t) for seq, t in P.numbered(transcripts) if t.prompt < len(t.ids)]

    def hits(settings: EmbeddedSettings, cold: dict[int, Any]) -> dict[int, Any]:
        engine = engines.get(settings)
        return {seq: hit_state(Scheduler, engine, t.ids, t.prompt, cold[seq],
                               chunk=settings.chunk_size) for seq, t in seqs}

    keep = {seq for seq, _ in seqs}
    model_g = engines.get(good).model
    g_ref = state_capture({s: c for s, c in g_cold.items() if s in keep}, model_g, "good cold")
    null: dict[str, list[tuple[str, Compared]]] = {}
    g_hit = state_capture(hits(good, g_cold), model_g, "good hit")
    for key, pair in null_comparisons(g_ref, "good end's own hit", g_hit).items():
        null.setdefault(key, []).append(pair)
    for arm, cold in arm_cold.items():
        other = state_capture({s: c for s, c in cold.items() if s in keep}, model_g, arm)
        for key, pair in null_comparisons(g_ref, arm, other).items():
            null.setdefault(key, []).append(pair)
    model_b = engines.get(bad).model
    b_ref = state_capture({s: c for s, c in b_cold.items() if s in keep}, model_b, "bad cold")
    b_hit = state_capture(hits(bad, b_cold), model_b, "bad hit")
    return localise(b_ref, b_hit, null), (b_ref, b_hit)


# ---- the report of an embedded run ----------------------------------------------------------


def _forward_of(steps: Sequence[tuple[Any, ...]], seq: int, pos: int) -> int | None:
    for f, rows in enumerate(steps):
        if any(r.seq == seq and r.start <= pos < r.start + r.n for r in rows):
            return f
    return None


def _save_pass(engines: Engines, s: EmbeddedSettings, transcripts: Sequence[P.Transcript],
               module: str, seq: int, pos: int) -> tuple[Any, int] | None:
    """The raw tensors of `module`'s sites in the forwards up to the one computing (seq, pos)."""
    steps = P.schedule(transcripts, P.BASE, s.chunk_size)
    f = _forward_of(steps, seq, pos)
    if f is None:
        return None
    engine = engines.get(s)
    with recording(engine.model, keep=lambda key: key.startswith(module + ":")) as rec:
        P.run(engine.model, transcripts, steps[:f + 1], rec)
    return rec, f


def save_first(engines: Engines, good: EmbeddedSettings, bad: EmbeddedSettings,
               result: EmbeddedResult, first: Any, out: Any) -> tuple[dict[str, Any], str | None]:
    """first_divergence.pt: the first divergent op's rows in both ends (and its inputs'), and,
    for an op `repro.py` recomputes, its inputs in the forward where it first diverged with
    both configurations' settings. Returns the figures of the kernel's parts (if split) and
    the part's op name (None: not split)."""
    from dsv4bisect.localise import repro
    from dsv4bisect.reference.config import Numerics

    site, j = first.site, first.judged
    seq, pos = j.outside[0] if j.outside else (
        int(first.compared.seqs[0]), int(first.compared.positions[0]))

    def rows(cap: Capture, key: str) -> dict[str, Any]:
        got = cap.site_rows(key, seq)
        return {} if got is None else {"positions": torch.from_numpy(got[0]),
                                       "rows": torch.from_numpy(got[1])}

    saved: dict[str, Any] = {
        "op": site.op, "module": site.module, "layer": site.layer, "site": site.key,
        "seq": seq, "positions": [p for s, p in j.outside if s == seq],
        "outputs_by_position": {"good": rows(result.good, site.key),
                                "bad": rows(result.bad, site.key)},
        "inputs_by_position": {k: {"good": rows(result.good, k), "bad": rows(result.bad, k)}
                               for k in site.inputs},
        "repro_inputs": None, "forward": None, "outputs": None, "settings": {}}
    part, parts = None, None
    if site.op in repro.REPRO_OPS and site.layer is not None:
        got_g = _save_pass(engines, good, result.transcripts, site.module, seq, pos)
        got_b = _save_pass(engines, bad, result.transcripts, site.module, seq, pos)
        if got_g is not None and got_b is not None:
            (rec_g, f), (rec_b, fb) = got_g, got_b
            model = engines.get(good).model
            inputs = repro.build(site.op, site.module, rec_g.raw, rec_g.layouts[f], f, seq,
                                 model)
            if inputs is not None:
                numerics = {end: Numerics.from_patches(s.patches, s.moe_backend,
                                                       precision=s.precision)
                            for end, s in (("good", good), ("bad", bad))}
                settings = {end: repro.op_settings(site.op, n, model, site.layer)
                            for end, n in numerics.items()}
                with torch.inference_mode():
                    outs = {end: repro.run_op(site.op, inputs, settings[end])
                            for end in ("good", "bad")}
                saved.update(repro_inputs=inputs, forward=f, settings=settings, outputs=outs)
                if site.op == "attn.sparse_attention":
                    with torch.inference_mode():
                        part, parts = repro.kernel_parts(repro.kernel_inputs(inputs),
                                                         settings["good"]["kernel"],
                                                         settings["bad"]["kernel"])
                    saved["op"] = part
            del rec_b, fb
    torch.save(saved, out / "first_divergence.pt")
    return (parts or {}), part


def save_state(loc: Localisation, states: tuple[Capture, Capture], out: Any) -> str:
    """first_divergence.pt for a state difference: the state site's rows in the bad end, cold
    and restored, at every position each held, per sequence."""
    site = loc.first.site
    cold, hit = states

    def rows(cap: Capture) -> dict[int, dict[str, torch.Tensor]]:
        out_rows = {}
        for seq, (pos, r) in cap.rows[site.key].by_seq().items():
            out_rows[seq] = {"positions": torch.from_numpy(pos), "rows": torch.from_numpy(r)}
        return out_rows

    torch.save({"kind": "state", "op": site.op, "module": site.module, "layer": site.layer,
                "site": site.key, "cold": rows(cold), "restored": rows(hit)},
               out / "first_divergence.pt")
    return "first_divergence.pt"


def localise_embedded(q: Any, ends: Any, good: EmbeddedSettings, bad: EmbeddedSettings,
                      cases: list[CaseTokens], out: Any, notes: list[str],
                      progress: Progress) -> Any:
    """The embedded engine's answer to `q` as a LocaliseResult; files written into `out`."""
    from dsv4bisect.localise import report
    from dsv4bisect.localise.question import case_infos, end_info, spec_divergence
    from dsv4bisect.localise.result import LocaliseResult
    from dsv4bisect.probe.spec import tier_spec

    engines = Engines()
    spec = tier_spec(q.tier or (ends.bad.probe or {}).get("tier") or "smoke")
    if not cases:
        cases = drift_transcripts(engines, good, spec, q.cases, progress)
    arms = [a for a in P.NULL_ARMS if q.arms is None or a.name in q.arms]
    spec_prompts = accuracy_prompts(engines.get(bad), spec) if bad.speculative else []
    run = run_embedded(good, bad, cases, spec_prompts=spec_prompts, arms=arms,
                       engines=engines, progress=progress)
    names = {seq: t.case_id for seq, t in P.numbered(run.transcripts)}
    activation = None
    files: dict[str, str] = {}
    if run.activations.first is not None:
        activation = report.divergence(run.activations.first, names, "activation")
        progress(f"saving {activation.site} and its op-level repro")
        parts, part = save_first(engines, good, bad, run, run.activations.first, out)
        files["tensors"] = "first_divergence.pt"
        files["repro"] = f"python -m dsv4bisect.localise.repro {out / 'first_divergence.pt'}"
        if part is not None:
            info = ops.op(part)
            activation = activation.model_copy(update={"op": part, "what": info.what,
                                                       "acts_on": list(info.acts_on),
                                                       "parts": parts})
    state = report.state_check("prefix-cache restore against the cold prefill", run.restore,
                               names)
    if activation is None and run.restore is not None and run.restore.first is not None \
            and run.restore_states is not None:
        files["tensors"] = save_state(run.restore, run.restore_states, out)
    speculation = None if run.spec is None else spec_divergence(run.spec)
    first = report.first_of([activation, state.first if state else None, speculation])
    seq = None
    if run.activations.first is not None and run.activations.first.judged.outside:
        seq = run.activations.first.judged.outside[0][0]
    files.update(report.write_plots(run.activations, seq if seq is not None else 0, out))
    files["report"] = "report.md"
    files["json"] = "localise.json"
    return LocaliseResult(
        engine="embedded", profile=ends.bad.profile,
        bisect_dir=str(q.bisect.run_dir) if q.bisect else None,
        culprit=ends.culprit.describe(), revert=ends.revert, good_end_how=ends.how,
        ends={"good": end_info(ends.good, good), "bad": end_info(ends.bad, bad)},
        cases=case_infos(cases), null_arms=list(run.null_arms),
        alignment=report.alignment(run.activations), first_divergence=first,
        activations=activation, state=state, speculation=speculation,
        speculation_prompts=run.spec_prompts, downstream=report.downstream(run.activations),
        files=files, notes=notes, seconds={k: round(v, 1) for k, v in run.seconds.items()})
