"""The bisect's live view on stderr (Rich), fed by the driver's and the engine runner's events."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType
from rich.live import Live
from rich.text import Text

from dsv4bisect.probe import verdict as V
from dsv4bisect.run.events import EngineEvent, Notice, ProbeEvent, RunEvent
from dsv4bisect.ui.console import console
from dsv4bisect.ui.progress import stage_label

if TYPE_CHECKING:
    from dsv4bisect.bisect.events import Event


class BisectDisplay:
    """Live view on stderr: the posterior's top hypotheses, the trial running (engine and probe
    stage), the trials so far. Thread-safe (runner events come from probe threads). Off a
    terminal: one plain line per trial started, finished and decided, and per new leader."""

    def __init__(self) -> None:
        self._con = console()
        self._lock = threading.Lock()
        self._live: Live | None = None
        self._progress: Any = None  # the last bisect Progress event
        self._current: tuple[str, float] | None = None  # label, start time
        self._stage = ""
        self._done: list[tuple[str, str, str]] = []  # step, subset, outcome
        self._leader = ""

    def __enter__(self) -> BisectDisplay:  # noqa: PYI034 - a plain class, not subclassed
        if self._con.is_terminal:
            self._live = Live(get_renderable=self._render, console=self._con,
                              refresh_per_second=4)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def note(self, text: str, style: str | None = "dim") -> None:
        target = self._live.console if self._live is not None else self._con
        target.print(text, style=style, markup=False, highlight=False)

    def __call__(self, event: Event) -> None:
        from dsv4bisect.bisect.events import Progress, StepDecided, TrialFinished, TrialStarted

        with self._lock:
            if isinstance(event, Progress):
                self._progress = event
                leader = f"{event.top[0][0]} {event.top[0][1]:.3f}" if event.top else ""
                if self._live is None and event.top and event.top[0][0] != self._leader:
                    self.note(f"leading: {leader} (phase {event.phase}, ~{event.remaining} "
                              "more trials)")
                self._leader = event.top[0][0] if event.top else ""
            elif isinstance(event, TrialStarted):
                what = subset_label(event.subset)
                again = f", attempt {event.attempt}" if event.attempt > 1 else ""
                label = f"{_trial(event)}: {what} (seed block {event.seed_block}{again})"
                self._current = (label, time.monotonic())
                if self._live is None:
                    self.note(self._current[0] + " ...", None)
            elif isinstance(event, TrialFinished):
                r = event.result
                word = V.as_run_says(r.verdict, r.signature,
                                     (r.details.get("drift") or {}).get("status"))
                like = " like the bad end" if word != r.verdict and r.verdict == V.FAIL else ""
                text = (f"{_trial(event)}: {word}"
                        + (f" ({r.signature}{like})" if r.signature else "")
                        + f" in {r.duration_s:.0f} s")
                self._current, self._stage = None, ""
                if self._live is None:
                    self.note(text, None)
            elif isinstance(event, StepDecided):
                src = " (from the ledger)" if event.reused else ""
                what = subset_label(event.subset)
                head, tail = _trial(event, "step"), f"{V.SEARCH_WORDS[event.outcome]}{src}"
                self._done.append((head, what, tail))
                if self._live is None:
                    self.note(f"{head}: {what} -> {tail}", "dim")

    def run_event(self, event: RunEvent) -> None:
        """What the engine runner's trial reports (engines starting, probe stages, notices)."""
        with self._lock:
            if isinstance(event, EngineEvent):
                self._stage = f"{event.arm} {event.role}: {event.state}"
            elif isinstance(event, ProbeEvent):
                p = event.progress
                self._stage = f"{stage_label(event.stage, p.phase)}: {p.done}/{p.total}"
            elif isinstance(event, Notice) and event.level == "warn":
                self.note(event.text, "yellow")

    def _render(self) -> RenderableType:
        with self._lock:
            parts: list[RenderableType] = []
            p = self._progress
            if p is not None:
                parts.append(Text(f"bisect: {p.phase}, {p.trials_used} trials, "
                                  f"~{p.remaining} to go", style="bold"))
                for name, prob in p.top:
                    bar = "█" * round(prob * 30)
                    parts.append(Text(f"  {prob:6.3f} {bar:<30} {name}"))
            if self._current is not None:
                label, t0 = self._current
                parts.append(Text(f"{label}  {time.monotonic() - t0:.0f} s  {self._stage}",
                                  style="yellow", no_wrap=True, overflow="ellipsis"))
            width = self._con.width
            parts += [Text(step_line(*done, width), style="dim", no_wrap=True)
                      for done in self._done[-8:]]
            return Group(*parts)


def _trial(event: Any, word: str = "trial") -> str:
    """Remedy-check trials (the bad end without the culprits, after the search) and the
    fresh-launch confirmation are not search steps: they say so."""
    if getattr(event, "confirmation", False):
        return f"fresh confirmation (step {event.step})"
    return f"remedy trial (step {event.step})" if event.remedy else f"{word} {event.step}"


def step_line(head: str, what: str, tail: str, width: int) -> str:
    """`step 1: {a, b, c} -> fail` in `width` columns: the set is shortened (`{a, b, …}`),
    never the outcome, which a terminal's cropping would otherwise cut off first."""
    line = f"{head}: {what} -> {tail}"
    if len(line) <= width or not what.startswith("{"):
        return line
    names = what[1:-1].split(", ")
    room = width - len(f"{head}:  -> {tail}")
    for keep in range(len(names) - 1, -1, -1):
        short = "{" + ", ".join([*names[:keep], f"… {len(names) - keep} more"]) + "}"
        if len(short) <= room or keep == 0:
            return f"{head}: {short} -> {tail}"
    return line


def subset_label(subset: frozenset[str]) -> str:
    return "{" + ", ".join(sorted(subset)) + "}" if subset else "good end"
