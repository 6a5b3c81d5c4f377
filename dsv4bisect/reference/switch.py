"""The embedded engine's side of the hot-switch protocol (base/switching.py).

In hot mode the launcher gives the server DSV4BISECT_SWITCH_DIR and DSV4BISECT_HOT (the patches
that may be switched in, at their bad-end variants). At `/flush_cache`, a switch request newer
than the one applied is applied with the batch drained (running requests finish, new ones wait,
the prefix cache is emptied: its states were computed by the old patch set): the same
`Transformer.configure` a fresh load runs, so a hot-switched engine computes exactly what a
fresh launch of the new patch set computes (tests/reference/test_engine_hot_switch.py). A
patch whose effect is fixed at load (nvfp4-dispatch) must keep its launch state; a request that
changes it, or turns on a patch outside DSV4BISECT_HOT, is refused with a receipt that says
why.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dsv4bisect import env as envvars
from dsv4bisect.base.switching import read_request, write_receipt
from dsv4bisect.errors import Dsv4BisectError
from dsv4bisect.patching.registry import builtin_patches
from dsv4bisect.patching.wire import format_patch_set, parse_patch_set
from dsv4bisect.patchspec.spec import EngineContext

log = logging.getLogger(__name__)
CONTEXT = EngineContext(kind="reference")


class HotSwitch:
    def __init__(self, engine: Any, generator: Any, info: dict[str, Any], switch_dir: Path,
                 hot: Mapping[str, str], role: str) -> None:
        self.engine, self.generator, self.info = engine, generator, info
        self.dir, self.hot, self.role = switch_dir, dict(hot), role
        self.launched = dict(engine.numerics.patches)
        self.generation = 0

    @classmethod
    def from_env(cls, engine: Any, generator: Any, info: dict[str, Any]) -> HotSwitch | None:
        where = os.environ.get(envvars.SWITCH_DIR)
        if not where:
            return None
        hot = parse_patch_set(os.environ.get(envvars.HOT, ""), builtin_patches())
        role = os.environ.get(envvars.ROLE, "server")
        switch = cls(engine, generator, info, Path(where), hot, role)
        switch.overlay = os.environ.get(envvars.ROLE_PATCHES, "")
        return switch

    overlay = ""  # a PD role's own patches (DSV4BISECT_ROLE_PATCHES): kept across switches

    def with_overlay(self, patches: Mapping[str, str]) -> dict[str, str]:
        """The requested set with this role's own toggles applied (`name[:variant]` on,
        `!name` off): the switch request names the profile's patches, the role keeps its own."""
        out = dict(patches)
        known = builtin_patches()
        for item in (i.strip() for i in self.overlay.split(",") if i.strip()):
            if item.startswith("!"):
                out.pop(item[1:], None)
            else:
                out.update(parse_patch_set(item, known))
        return {n: out[n] for n in known if n in out}

    def refusal(self, patches: Mapping[str, str]) -> str | None:
        """Why this patch set cannot be switched to in this engine (None: it can)."""
        known = builtin_patches()
        for name in sorted(set(patches) | set(self.launched)):
            want, had = patches.get(name), self.launched.get(name)
            if want == had:
                continue
            why = known[name].load_time_reason(CONTEXT)
            if why is not None:
                return f"{name} cannot change in a running engine ({why})"
            if want is not None and self.hot.get(name) != want and had != want:
                return f"{name}:{want} was not among the hot patches this engine was launched with"
        return None

    def apply_pending(self) -> None:
        """Apply a newer switch request, if any, and write its receipt."""
        request = read_request(self.dir)
        if request is None or request.generation <= self.generation:
            return
        known = builtin_patches()
        try:
            patches = self.with_overlay(parse_patch_set(request.patches, known))
            why = self.refusal(patches)
            if why is None:
                with self.generator.drained():  # waits for the running batch, holds new
                    self.engine.switch(patches)   # requests, empties the prefix cache
                self.info["patches"] = dict(self.engine.numerics.patches)
                self.info["switch_generation"] = request.generation
        except Dsv4BisectError as exc:
            why = exc.message
        self.generation = request.generation
        write_receipt(self.dir, request.generation, self.role, 0, ok=why is None, error=why,
                      patches=format_patch_set(self.engine.numerics.patches, known))
        log.info("switch %d: %s", request.generation, why or "applied")
