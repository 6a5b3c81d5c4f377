"""What a patch asks the installer to do in one engine process: a plan of hooks, returned by
the patch's planner for that engine kind (`Patch.planners`).

Hook types follow SGLang's `HookRegistry` (`sglang.srt.plugins.hook_registry.HookType`):
REPLACE `fn(*args, **kwargs)`, AROUND `fn(original, *args, **kwargs)`, AFTER
`fn(result, *args, **kwargs)`. `on_path` marks hooks that run in the forward pass; their first
call is recorded in the receipt as evidence that the patched path is really taken.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


class Recorder(Protocol):
    """What a hook may report back (implemented by the installer's receipt writer)."""

    def called(self, target: str) -> None: ...

    def log(self, key: str, value: Any) -> None: ...


@dataclass(frozen=True)
class HookSpec:
    target: str
    type: str  # replace | around | after
    fn: Callable[..., Any]
    on_path: bool = False


@dataclass(frozen=True)
class Plan:
    """`install` the hooks, or record `inert` / `refused` with the reason and install none."""

    action: str  # install | inert | refuse
    hooks: tuple[HookSpec, ...] = ()
    reason: str | None = None
    notes: tuple[str, ...] = ()
    check: Callable[[], str | None] | None = None  # after import: a reason to refuse, or None


def first_call(recorder: Recorder, target: str) -> Callable[[], None]:
    """A cheap callable that records the first call of `target` and then does nothing."""
    done = False

    def mark() -> None:
        nonlocal done
        if not done:
            done = True
            recorder.called(target)

    return mark


# A patch's hook planner on one engine kind: (variant, layout, recorder) -> the plan to install.
Planner = Callable[[str, str, Recorder], Plan]
