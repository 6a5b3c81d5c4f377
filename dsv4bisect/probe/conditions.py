"""How a verdict words its serving conditions: the arms and concurrency levels each family ran
under, and the throughput measured at each level (terminal, markdown and `probe` summaries)."""

from __future__ import annotations

from typing import Any


def family_conditions(cond: dict[str, Any] | None) -> str:
    """`cold@1 ×12, warm@16 ×12`: each arm@level with its paired requests (drift: `drift@1`)."""
    requests = (cond or {}).get("requests") or {}
    if not requests:
        return "-"
    return ", ".join(f"{label} ×{n}" for label, n in sorted(requests.items(), key=_order))


def _order(item: tuple[str, int]) -> tuple[int, str]:
    arm, _, level = item[0].partition("@")
    return (int(level) if level.isdigit() else 0, arm)


def throughput_lines(throughput: dict[str, Any] | None) -> list[str]:
    """How each configuration decoded where one speculated, then one line per configuration and
    level: requests/s and tokens/s, the streamed answers' time to first token and inter-token
    latency, with what ran there."""
    out = []
    decoding = (throughput or {}).get("decoding") or {}
    if any(d != "greedy" for d in decoding.values()):  # say so only where speculation ran
        out += [f"{who} decoded {d}" for who, d in decoding.items()]
    for who in ("baseline", "candidate"):
        levels = (throughput or {}).get(who) or {}
        for level in sorted(levels, key=int):
            f = levels[level]
            out.append(f"{who} at concurrency {level}: {f['requests_per_s']:.3g} requests/s, "
                       f"{f['tokens_per_s']:,.0f} tokens/s{_latency(f)} ({f['requests']} "
                       f"requests, {'/'.join(f.get('arms') or [])}, {f['wall_s']:.1f} s)")
    return out


def _latency(figures: dict[str, Any]) -> str:
    """`, TTFT 412 ms, ITL 38.1 ms`: the streamed answers' mean time to first token and mean
    inter-token latency (absent for a run made before the probe streamed)."""
    ttft, itl = figures.get("ttft_s_mean"), figures.get("itl_s_mean")
    out = f", TTFT {_duration(ttft)}" if ttft is not None else ""
    return out + (f", ITL {_duration(itl)}" if itl is not None else "")


def _duration(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"
