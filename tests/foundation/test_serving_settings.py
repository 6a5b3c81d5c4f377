"""The serving settings (SGLang's chunked_prefill_size, max_running_requests,
disable_radix_cache): one key each, the same flag names on both engine kinds, shown by
diff-config and `--why`, part of the fingerprint; and `probe.concurrency`."""

from __future__ import annotations

import pytest

from dsv4bisect.config.diff import diff_configs
from dsv4bisect.config.resolve import Overrides, resolve
from dsv4bisect.errors import ConfigError
from dsv4bisect.probe.spec import tier_spec
from dsv4bisect.run.ends import probe_spec

SERVING = ("engine.max_running_requests=8", "engine.disable_radix_cache=true",
           "engine.chunked_prefill_size=512")


def _flags(argv: tuple[str, ...]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for i, token in enumerate(argv):
        if token.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[token] = None if nxt is None or nxt.startswith("--") else nxt
    return out


def test_embedded_engine_gets_sglang_flag_names() -> None:
    cfg = resolve("reference", Overrides(sets=SERVING))
    flags = _flags(cfg.processes[0].argv)
    assert flags["--chunk-size"] == "512"  # the one chunk key, spelt as `serve` takes it
    assert flags["--max-running-requests"] == "8"
    assert "--disable-radix-cache" in flags and flags["--disable-radix-cache"] is None


def test_sglang_gets_its_own_flags_on_every_server_of_a_pd_pair() -> None:
    cfg = resolve("dsv4-flash-pd8", Overrides(sets=SERVING))
    servers = [p for p in cfg.processes if p.role in ("prefill", "decode")]
    assert len(servers) == 2
    for proc in servers:
        flags = _flags(proc.argv)
        assert flags["--chunked-prefill-size"] == "512"
        assert flags["--max-running-requests"] == "8"
        assert "--disable-radix-cache" in flags
        assert "--chunk-size" not in flags
    router = next(p for p in cfg.processes if p.role == "router")
    assert "--max-running-requests" not in router.argv


def test_unset_means_the_engines_default_and_no_flag() -> None:
    argv = resolve("reference").processes[0].argv
    assert "--max-running-requests" not in argv and "--disable-radix-cache" not in argv
    assert _flags(argv)["--chunk-size"] == "2048"  # the engine's own default, stated


def test_shipped_sglang_profiles_state_all_three() -> None:
    cfg = resolve("dsv4-flash-tp8")
    flags = _flags(cfg.processes[0].argv)
    assert flags["--chunked-prefill-size"] == "8192"
    assert flags["--max-running-requests"] == "256"
    assert "--disable-radix-cache" not in flags  # the cache on, as SGLang's default
    for key in ("engine.chunked_prefill_size", "engine.max_running_requests",
                "engine.disable_radix_cache"):
        assert "_dsv4-flash-base.yaml:" in cfg.provenance[key], key


def test_diff_config_why_and_fingerprint_show_each_setting() -> None:
    base = resolve("reference")
    for item in SERVING:
        other = resolve("reference", Overrides(sets=(item,)))
        assert other.fingerprint != base.fingerprint, item
        changes = [c for c in diff_configs(base, other) if c.section.startswith("process:")]
        assert changes, item
        key = item.split("=")[0]
        assert other.provenance[key] == f"--set {item}"


@pytest.mark.parametrize("bad", ["engine.max_running_requests=0",
                                 "engine.max_running_requests=99999999",
                                 "engine.disable_radix_cache=maybe",
                                 "probe.concurrency=[16, 1]", "probe.concurrency=[1, 1]",
                                 "probe.concurrency=[]", "probe.concurrency=[0]"])
def test_bad_values_are_refused_at_validation(bad: str) -> None:
    with pytest.raises(ConfigError, match=bad.split("=")[0]):
        resolve("reference", Overrides(sets=(bad,)))


def test_probe_concurrency_from_the_profile() -> None:
    smoke = probe_spec(resolve("reference"))
    assert smoke.concurrency == (1, 16)
    assert smoke.conditions() == (("cold", 1), ("hit", 1), ("warm", 16))
    sglang = probe_spec(resolve("dsv4-flash-tp8"))
    assert sglang.tier == "standard" and sglang.concurrency == (1, 32)
    other = probe_spec(resolve("reference", Overrides(sets=("probe.concurrency=[1, 4, 8]",))))
    assert other.conditions() == (("cold", 1), ("warm", 4), ("hit", 8))
    # probe.warm=false drops the warm arm, the tier's others stay
    nowarm = probe_spec(resolve("reference", Overrides(sets=("probe.warm=false",))))
    assert nowarm.conditions() == (("cold", 1), ("hit", 16))
    # the tests' tier keeps one level whatever the profile lists
    assert probe_spec(resolve("reference"), "ci").concurrency == (1,)
    assert probe_spec(resolve("reference"), "ci") == tier_spec("ci")
