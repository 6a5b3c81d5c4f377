"""The good end `localise` compares against: the bad end with the culprit reverted
(localise/ends.py), and the embedded configuration as it loads in-process (settings.py)."""

from __future__ import annotations

import pytest

from dsv4bisect.config.resolve import Overrides
from dsv4bisect.errors import ConfigError
from dsv4bisect.localise.ends import bisect_ends, profile_ends
from dsv4bisect.localise.settings import EmbeddedSettings


def test_only_a_real_patch_reverts_to_every_patch_off() -> None:
    ends = profile_ends("reference", Overrides(only=("mhc-bf16",)))
    assert ends.good.patch_set == {} and ends.bad.patch_set == {"mhc-bf16": "bf16"}
    assert ends.culprit.patches == {"mhc-bf16": (None, "bf16")}


def test_a_fault_variant_reverts_to_its_patch_s_default_unless_asked_otherwise() -> None:
    flags = Overrides(only=("mma-decode",), sets=("patches.mma-decode.variant=merge-no-rescale",))
    ends = profile_ends("reference", flags)
    assert ends.good.patch_set == {"mma-decode": "split-k"}
    assert ends.bad.patch_set == {"mma-decode": "merge-no-rescale"}
    assert "fault reverted" in ends.how
    off = profile_ends("reference", flags, revert="patch")
    assert off.good.patch_set == {}


def test_without_only_the_profile_s_own_patches_stay_on() -> None:
    ends = profile_ends("reference-all",
                        Overrides(sets=("patches.mma-decode.variant=compress-rope-base",)))
    assert ends.good.patch_set == {**ends.bad.patch_set, "mma-decode": "split-k"}
    assert list(ends.culprit.patches) == ["mma-decode"]


def test_a_setting_is_a_culprit_too() -> None:
    ends = profile_ends("reference", Overrides(sets=("engine.chunked_prefill_size=512",)))
    assert ends.culprit.settings == ("engine.chunked_prefill_size=512",)
    good, bad = EmbeddedSettings.from_config(ends.good), EmbeddedSettings.from_config(ends.bad)
    assert (good.chunk_size, bad.chunk_size) == (2048, 512)
    assert good.patches == bad.patches == {}


def test_a_no_effect_patch_still_makes_two_configurations() -> None:
    """trtllm-clamp under the triton MoE backend changes nothing, but it is a configuration of
    its own (localise then finds that nothing diverges)."""
    ends = profile_ends("reference", Overrides(only=("trtllm-clamp",)))
    assert ends.good.fingerprint != ends.bad.fingerprint


def test_nothing_to_localise_and_unknown_culprits_are_bad_input() -> None:
    with pytest.raises(ConfigError, match="nothing to localise"):
        profile_ends("reference", Overrides())
    with pytest.raises(ConfigError, match="not a patch"):
        profile_ends("reference-all", Overrides(), culprit=("no-such-patch",))


def test_the_bisect_form_reverts_only_the_culprit() -> None:
    bad = {"hash-topk-scaling": "topk", "mhc-bf16": "bf16", "nvfp4-dispatch": "hybrid",
           "mma-decode": "compress-rope-base", "triton-indexer": "bf16"}
    ends = bisect_ends("reference-all", (), bad, ("mma-decode",))
    assert ends.bad.patch_set == bad
    assert ends.good.patch_set == {**bad, "mma-decode": "split-k"}


def test_speculation_and_its_fault_are_read_from_the_patch() -> None:
    ends = profile_ends("reference", Overrides(
        only=("nextn-speculation",), sets=("patches.nextn-speculation.variant=draft-eos",)))
    good, bad = EmbeddedSettings.from_config(ends.good), EmbeddedSettings.from_config(ends.bad)
    assert good.speculative is not None and good.patches["nextn-speculation"] == "nextn"
    assert bad.patches["nextn-speculation"] == "draft-eos" and bad.load_key == good.load_key


@pytest.mark.parametrize(("profile", "says"), [("reference-pd", "PD deployment"),
                                               ("dsv4-flash-vllm-tp8", "`vllm` engine")])
def test_a_pd_or_vllm_profile_is_bad_input_with_a_hint(profile: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as err:
        profile_ends(profile, Overrides(only=("mhc-bf16",)))
    assert err.value.hint
