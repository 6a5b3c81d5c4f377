"""`localise` on SGLang, through its own dumper (field-update §3, the maintainers' recipe).

Both configurations are launched with the dumper set as the release reads it
(`sglang_contract.launch_env`: off at boot, non-intrusive mode `all`, its routes on the engine's
own port, a dump directory per end) and CUDA graphs off (`graphs_off`: hooks do not run inside a
graph replay). The release's contract is read from the installed SGLang's source first and a
difference is an error before anything launches. Per experiment the dumper is switched on with
`POST /dumper/configure {"enable": true, "exp_name": ...}`, the failing prompts are prefilled
teacher-forced (`/generate` with input logprobs; the cache flushed first, so nothing is a hit),
and it is switched off again. The good end runs the null arms too (the prefix sent alone first,
then the whole transcript, which prefills the rest: `rechunk@f`; every transcript at once:
`rebatch`). The dumps are read with the release's own loader code (`sglang_dumps.py`) and judged
by the same rule as the embedded engine's captures; `python -m sglang.srt.debug_utils.comparator`
over the two base dumps is printed as the cross-check.

What it cannot do that the embedded path does: tap functional ops (the dumper sees module
calls), run decode steps teacher-forced, or read decoding state (SGLang's `--kv-canary` is the
tool for that; its findings are in the engine's log).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import requests

from dsv4bisect.config.engine_config import EngineConfig
from dsv4bisect.errors import ConfigError, EngineError
from dsv4bisect.localise import protocol as P
from dsv4bisect.localise.cases import CaseTokens
from dsv4bisect.localise.sglang_contract import (
    DumperContract,
    comparator_command,
    launch_env,
    problems,
    read_contract,
)

CONFIGURE = "/dumper/configure"


def with_dumper(cfg: EngineConfig, dump_dir: Path, contract: DumperContract) -> EngineConfig:
    """`cfg` with every engine process launched with the dumper's env and graphs off."""
    env = launch_env(str(dump_dir), contract)
    procs = []
    for p in cfg.processes:
        argv = tuple(p.argv) + tuple(f for f in contract.graphs_off if f not in p.argv)
        procs.append(replace(p, argv=argv, env=tuple(sorted({**dict(p.env), **env}.items()))))
    return replace(cfg, processes=tuple(procs))


def configure(url: str, api_key: str | None = None, **body: Any) -> None:
    """POST /dumper/configure on the engine's port (`DUMPER_SERVER_PORT=reuse`)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    resp = requests.post(url.rstrip("/") + CONFIGURE, json=body, timeout=60, headers=headers)
    if resp.status_code != 200:
        raise EngineError(f"POST {CONFIGURE} answered {resp.status_code}: {resp.text[:200]}",
                          "is the dumper on (DUMPER_SERVER_PORT=reuse reached the engine)?")


def send(client: Any, transcripts: Sequence[P.Transcript], arm: P.Arm) -> None:
    """The arm's requests: every transcript teacher-forced from a cold cache (`base`), after
    its prefix alone (`rechunk@f`), or all at once (`rebatch`)."""
    client.flush_cache()
    if arm.rebatch:
        with ThreadPoolExecutor(max_workers=len(transcripts)) as pool:
            list(pool.map(lambda t: client.score(t.ids, start=1, top_k=1), transcripts))
        return
    for t in transcripts:
        client.flush_cache()
        if arm.split is not None:
            cut = min(len(t.ids) - 1, max(1, round(arm.split * t.prompt)))
            client.generate(t.ids[:cut], max_new_tokens=1)
        client.score(t.ids, start=1, top_k=1)


def localise_sglang(q: Any, ends: Any, progress: Any) -> tuple[Any, Path]:
    """Launch both ends with the dumper, send the cases, judge the dumps (see the module doc)."""
    from dsv4bisect.base import atomic
    from dsv4bisect.base.unique_dir import make_unique_dir
    from dsv4bisect.engines.launcher import Launch
    from dsv4bisect.engines.preflight import engine_python, installed_source
    from dsv4bisect.localise import report
    from dsv4bisect.localise.question import case_infos, pick_cases
    from dsv4bisect.localise.judge import localise, null_comparisons
    from dsv4bisect.localise.result import EndInfo, LocaliseResult
    from dsv4bisect.localise.sglang_dumps import load_capture, release_loader
    from dsv4bisect.localise.sites import Compared
    from dsv4bisect.probe.runner import open_client
    from dsv4bisect.probe.spec import tier_spec
    from dsv4bisect.run.arm import verify_patches

    t0 = time.perf_counter()
    src = installed_source(engine_python(ends.bad))
    if src is None:
        raise ConfigError("no SGLang installed in the engine's Python",
                          "install the release the profile pins (`dsv4bisect doctor`)")
    contract = read_contract(src)
    wrong = problems(contract)
    if wrong:
        raise ConfigError(f"SGLang {contract.release}'s dumper is not the one localise drives: "
                          + "; ".join(wrong), "localise supports the verified releases' dumper")
    loader = release_loader(src.text("sglang/srt/debug_utils/dump_loader.py") or "")
    cases, notes = pick_cases(q, progress)
    out = make_unique_dir(Path(q.out), "localise")
    spec = tier_spec(q.tier or (ends.bad.probe or {}).get("tier") or "smoke")
    transcripts: list[P.Transcript] = [P.Transcript(c.case_id, c.ids, len(c.prompt))
                                       for c in cases]
    arms = [a for a in P.NULL_ARMS if q.arms is None or a.name in q.arms]
    dirs: dict[str, Path] = {}
    for end, cfg in (("good", ends.good), ("bad", ends.bad)):
        dump_dir = out / "dumps" / end
        launched = with_dumper(cfg, dump_dir, contract)
        progress(f"{end} end: launching SGLang {contract.release} with the dumper, graphs off")
        key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
        with Launch(launched, out / end) as launch:
            verify_patches(launched, launch)  # a patch that did not take is no comparison
            client = open_client(launch.url, spec, key, cfg.served_model_name)
            if not transcripts:  # the tier's drift cases with the good end's greedy answers
                transcripts = _drift(client, spec, q.cases, cases)
            for arm in [P.BASE, *(arms if end == "good" else [])]:
                progress(f"{end} end: dumping `{arm.name}`")
                configure(launch.url, key, enable=True, exp_name=arm.name)
                send(client, transcripts, arm)
                configure(launch.url, key, enable=False)
        dirs[end] = dump_dir
    ids = [t.ids for t in transcripts]
    good = load_capture(dirs["good"] / P.BASE.name, loader, ids, "good")
    bad = load_capture(dirs["bad"] / P.BASE.name, loader, ids, "bad")
    null: dict[str, list[tuple[str, Compared]]] = {}
    for arm in arms:
        other = load_capture(dirs["good"] / arm.name, loader, ids, arm.name)
        for key, pair in null_comparisons(good, arm.name, other).items():
            null.setdefault(key, []).append(pair)
    loc = localise(good, bad, null)
    names = {i: t.case_id for i, t in enumerate(transcripts)}
    first = None if loc.first is None else report.divergence(loc.first, names, "activation")
    cmp = comparator_command(str(dirs["good"] / P.BASE.name), str(dirs["bad"] / P.BASE.name))
    files = report.write_plots(loc, 0, out) | {"report": "report.md", "json": "localise.json"}
    result = LocaliseResult(
        engine="sglang", profile=ends.bad.profile,
        bisect_dir=str(q.bisect.run_dir) if q.bisect else None,
        culprit=ends.culprit.describe(), revert=ends.revert, good_end_how=ends.how,
        ends={k: EndInfo(fingerprint=c.fingerprint, patches=dict(c.patch_set),
                         settings={"release": contract.release,
                                   "graphs_off": list(contract.graphs_off)})
              for k, c in (("good", ends.good), ("bad", ends.bad))},
        cases=case_infos([CaseTokens(t.case_id, t.ids[:t.prompt], t.ids[t.prompt:])
                          for t in transcripts]),
        null_arms=[a.name for a in arms], alignment=report.alignment(loc),
        first_divergence=first, activations=first,
        downstream=report.downstream(loc), files=files, comparator=" ".join(cmp),
        notes=[*notes, ("SGLang path: module calls only (no functional taps), prefill only, "
                        "no state check")], seconds={"total": round(time.perf_counter() - t0, 1)})
    atomic.write_json(out / "localise.json", result.to_json())
    atomic.write_text(out / "report.md", report.markdown(result))
    return result, out


def _drift(client: Any, spec: Any, n: int, cases: list[CaseTokens]) -> list[P.Transcript]:
    from dsv4bisect.probe.grid import build_cases, periods
    from dsv4bisect.probe.layout import calibrate
    from dsv4bisect.probe.vocab import PROBE_VOCAB

    info = client.describe()
    built = build_cases(spec, PROBE_VOCAB, client.count, calibrate(client.count, PROBE_VOCAB),
                        periods(info.compress_ratios or (4, 128), info.sliding_window))
    out = []
    for case in sorted((c for c in built if c.family == "drift"),
                       key=lambda c: -c.prompt_tokens)[:n]:
        ids = client.tokenize_messages(case.messages)
        if ids is None:
            raise ConfigError("the server cannot tokenize chat messages",
                              "pass --from RUN_DIR with the run's cases")
        answer = client.generate(ids, max_new_tokens=case.max_tokens)
        out.append(P.Transcript(case.case_id, tuple(ids) + tuple(answer), len(ids)))
    del cases
    return out
