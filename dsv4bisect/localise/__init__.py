"""`dsv4bisect localise`: after the culprit, the op. Names the first module (layer, module path,
op) where the culprit configuration leaves the good end's numbers, on the embedded engine and on
SGLang through its own dumper, or the decoding state or speculative round that differs
(docs/localise.md).

Modules, down the pipeline: `driver.py` (a Question in, a result and its report directory out),
`ends.py` (the good end: the bad end with the culprit reverted), `cases.py` (which tokens),
`settings.py` (an embedded configuration as loaded in-process), `embedded.py` (both ends
teacher-forced and recorded: `protocol.py` the runs and null arms, `capture.py` the recorder),
`state.py` (the restored state against a cold prefill), `speculation.py` (rounds against
greedy decoding), `sglang_contract.py` / `sglang_dumps.py` / `sglang_run.py` (SGLang's dumper:
its contract per release, its dumps, launching both ends with it), and the pure core:
`ops.py` (the op table), `sites.py` (sites and divergence), `stats.py` (envelopes),
`judge.py` (the first divergence), `result.py` / `report.py` (JSON, markdown, plots),
`repro.py` (the op alone on saved inputs), `command.py` (the command lines others print).
"""
