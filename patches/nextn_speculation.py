"""nextn-speculation — MTP speculative decoding (SGLang's `--speculative-algorithm NEXTN`).

Speeds up: decoding. The checkpoint's MTP layer drafts 3 tokens one after the other, the main
model verifies the last token and the drafts in one forward and keeps the longest acceptable
prefix plus its own next token (SGLang's DeepSeek default: 3 steps, top-k 1, 4 draft tokens,
`arg_groups/speculative_hook.py` `_auto_choose_speculative_params`, 0.5.23). On an H200
deployment that is fewer main-model forwards per output token; on the embedded engine
`reference/spec_decode.py` runs it inside the scheduler's decode batch (docs/reference-engine.md,
"Speculative decoding").

Numerical risk (tier 2): correct verification emits exactly the main model's greedy tokens
(and, sampling, its distribution), but the verify forward runs 1 + k tokens per request, so
batch-size-dependent kernels see other row counts, and the verification and cache rollback are
new code on every decode step. The field's failures were in the verification: EAGLE verify that
silently took the argmax path for sampled requests on ROCm (sglang PR #39253, after #31214; an
8.97-point Simple-QA gap on DeepSeek-V4) and false EOS / truncated answers with MTP under CUDA
graphs (InferenceX PR #1631). Both are fault variants here.

Load time: SGLang builds the draft worker and captures its CUDA graphs at launch and its hot
switch refuses speculative decoding (docs/hot-switching.md), so turning it on or off is a fresh
launch on both engine kinds.

How to verify: a bisect against the same profile without it; `/server_info`'s
`spec_accept_rate`, `avg_spec_accept_length` and `main_forwards_per_output_token`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from dsv4bisect.patchspec.spec import Patch, SglangDelivery, SglangRule, Variant, VllmDelivery
from dsv4bisect.patchspec.swaps import Op, Site, Swap

ARGS = ("--speculative-algorithm", "NEXTN")
# vLLM's MTP drafting with the checkpoint's one MTP layer (SpeculativeConfig.method "mtp", which
# vLLM maps DeepSeek-V4's MTP to)
VLLM_SPECULATIVE = {"method": "mtp", "num_speculative_tokens": 1}


def _greedy_verify(site: Site) -> Callable[..., Any]:
    """`Op.SPEC_VERIFY`, the `greedy-verify` fault (sglang PR #39253, after #31214): every
    request's drafts verified and committed by argmax, sampled ones too."""
    verify = site.stock
    return lambda r, drafts, rows: verify.greedy(drafts, rows)


def stop_at_drafted_stop(verdict: Any, drafts: list[int], stop_ids: frozenset[int]) -> Any:
    """The `draft-eos` fault (false EOS / truncation with MTP, InferenceX PR #1631): the stop
    check reads the round's draft tokens instead of the verified ones, so a stop id the MTP
    layer drafted ends the request after the accepted prefix, whether or not the main model
    agreed. `verdict` is the round's `speculative.Verdict` (tokens, accepted)."""
    hit = next((i for i, d in enumerate(drafts) if d in stop_ids), None)
    if hit is None or hit < verdict.accepted:  # verified: the real stop path handles it
        return verdict
    return dataclasses.replace(verdict, tokens=[*verdict.tokens[: verdict.accepted],
                                                drafts[hit]])


def _draft_eos(site: Site) -> Callable[..., Any]:
    """`Op.SPEC_VERIFY`: the stock verification, then `stop_at_drafted_stop`."""
    verify = site.stock
    return lambda r, drafts, rows: stop_at_drafted_stop(verify(r, drafts, rows), drafts,
                                                        r.stop_ids)


PATCH = Patch(
    name="nextn-speculation",
    summary="MTP speculative decoding: --speculative-algorithm NEXTN (3 steps, top-k 1, 4 tokens)",
    tier=2,
    touches=("decode.speculative",),
    reference="speculative decoding with the checkpoint's MTP layer (reference/spec_decode.py)",
    sglang=SglangDelivery(hooks={}, args=ARGS, rules=(
        SglangRule((0, 5, 13), None, "args", evidence=(
            "server_args.py: --speculative-algorithm NEXTN (an EAGLE alias drafting with the "
            "checkpoint's MTP layer); speculative_hook.py picks (3, 1, 4) when the steps are "
            "unset")),
    )),
    variants=(
        Variant("nextn", "SGLang's NEXTN chain, verified greedily or by rejection sampling"),
        Variant("greedy-verify", "sampled requests verified and committed by argmax, as EAGLE "
                "verify on ROCm before sglang PR #39253 (#31214)", fault=True),
        Variant("draft-eos", "a stop id the MTP layer drafted ends the request unverified: "
                "false EOS / truncation with MTP under CUDA graphs (InferenceX PR #1631)",
                fault=True),
    ),
    load_time=("the draft worker and its CUDA graphs are built at launch; SGLang's hot switch "
               "refuses speculative decoding (docs/hot-switching.md)"),
    embedded="speculative decoding in the scheduler's decode batch (the MTP layer drafts)",
    vllm=VllmDelivery(
        "args", "vllm serve --speculative-config: MTP drafting with the checkpoint's MTP layer "
        "(SpeculativeConfig.method 'mtp')",
        args=("--speculative-config", json.dumps(VLLM_SPECULATIVE, separators=(",", ":"))),
        variants=("nextn",)),
    doc=__doc__ or "",
    # on the embedded engine: SGLang's arguments turn its speculative decoding on (every
    # variant); the faults swap its verification
    swaps=(Swap(Op.SPECULATION, lambda site: ARGS),
           Swap(Op.SPEC_VERIFY, _greedy_verify, ("greedy-verify",)),
           Swap(Op.SPEC_VERIFY, _draft_eos, ("draft-eos",))),
)
