"""ProbeSpec: canonical form, hashing, validation, tiers and their computed power."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4bisect.errors import ConfigError
from dsv4bisect.probe.power import power_table, tier_power
from dsv4bisect.probe.spec import PROBE_VERSION, TIER_NAMES, ProbeSpec, tier_spec


def test_hash_is_stable_and_sensitive() -> None:
    a, b = tier_spec("smoke"), tier_spec("smoke")
    assert a.spec_hash() == b.spec_hash() and len(a.spec_hash()) == 16
    assert a.replace(notes="anything").spec_hash() == a.spec_hash()
    # The seed block is a separate key (a re-test of the same spec), not part of the hash.
    assert a.replace(seed_block=1).spec_hash() == a.spec_hash()
    assert a.replace(seed_block=1) != a
    for change in ({"seed": 3}, {"lengths": (512, 1024)},
                   {"depths": (0.1, 0.5)}, {"jitter": 1}, {"max_tokens": 65}):
        assert a.replace(**change).spec_hash() != a.spec_hash(), change
    assert json.loads(a.canonical_json())["probe_version"] == PROBE_VERSION


def test_round_trip_and_version_guard() -> None:
    spec = tier_spec("standard", families=("needle", "drift"), seed_block=7)
    again = ProbeSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec and again.spec_hash() == spec.spec_hash()
    old = {**spec.to_dict(), "probe_version": PROBE_VERSION - 1}
    with pytest.raises(ConfigError, match="probe version"):
        ProbeSpec.from_dict(old)
    with pytest.raises(ConfigError, match="unknown probe spec keys: bogus"):
        ProbeSpec.from_dict({**spec.to_dict(), "bogus": 1})


@pytest.mark.parametrize(("change", "match"), [
    ({"families": ("needel",)}, "did you mean `needle`"),
    ({"families": ()}, "non-empty"),
    ({"lengths": (32,)}, "lengths"),
    ({"depths": (1.5,)}, "depths"),
    ({"arms": ("hot",)}, "unknown arm"),
    ({"queries": 9}, "queries"),
    ({"copy_chars": (40, 20)}, "copy_chars"),
])
def test_validation_errors_name_the_field(change: dict, match: str) -> None:
    with pytest.raises(ConfigError) as exc:
        tier_spec("smoke").replace(**change)
    assert match in f"{exc.value.message} {exc.value.hint}"


def test_unknown_tier_suggests() -> None:
    with pytest.raises(ConfigError, match="unknown probe tier `smok`") as exc:
        tier_spec("smok")
    assert "smoke" in (exc.value.hint or "")


def test_tiers_grow_in_power() -> None:
    powers = [tier_power(tier_spec(t)) for t in TIER_NAMES]
    assert powers[0].min_detectable_loss_rate is None  # ci is for tests: 4 cases, no power
    rates = [p.min_detectable_loss_rate for p in powers[1:]]
    assert all(r is not None for r in rates)
    assert rates == sorted(rates, reverse=True)  # each tier detects smaller drops
    assert powers[1].min_detectable_cell_loss_rate is None  # smoke cannot see a one-cell loss
    deep = powers[-1]
    assert deep.accuracy_cases > 5000 and deep.min_detectable_loss_rate < 0.005
    assert "95 % power" in deep.statement()


def test_docs_tier_table_is_the_computed_one() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "probe.md").read_text()
    for line in power_table():
        assert line in doc, f"docs/probe.md is out of date; expected the row:\n{line}"
