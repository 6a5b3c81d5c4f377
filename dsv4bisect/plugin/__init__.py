"""The dsv4bisect SGLang plugin: installs the hooks of the patches named in DSV4BISECT_PATCHES.

SGLang runs every general plugin of the entry-point group `sglang.srt.plugins` that
`SGLANG_PLUGINS` whitelists, in the engine's main process and at the top of each scheduler
process (`run_scheduler_process`), before the model is built and before CUDA graphs are
captured. `main()` (`entry.py`) is that entry point. In a scheduler it reads the patch set
(wire format, `dsv4bisect.patching.wire`), detects the SGLang version and hook layout (a release
outside the verified list is refused unless DSV4BISECT_ALLOW_UNVERIFIED_SGLANG=1), installs
exactly those patches' hooks (or checks an upstream switch's value) and writes one receipt per
patch into DSV4BISECT_RECEIPTS. With no patches it installs nothing and writes nothing. In hot
mode (DSV4BISECT_SWITCH_DIR set) it also installs the candidates of DSV4BISECT_HOT behind
per-call gates and the switch in `Scheduler.flush_cache` (`dsv4bisect.plugin.hot`,
docs/hot-switching.md). Outside a scheduler (no model is built there) it does nothing. The entry
point imports no torch and no SGLang; the hook modules do, when installing. It is not in this
`__init__`, which every module of the package runs: it imports them.
"""
