"""The patches' vLLM hook bodies and the vLLM symbols they hook, beside `sglang_hooks/`: below
the patches, which point to their planners (`PATCH.planners.vllm`) and declare their sites
(`PATCH.vllm`), and below the plugin (`plugin/vllm/`), which installs them. Importing a module
here imports no torch and no vLLM: the hook bodies do, when they run."""

from __future__ import annotations

from typing import Any

# target -> the object before any dsv4bisect hook: the installer (`plugin/vllm/install.py`)
# keeps it when it hooks a target; a hook body that calls vLLM's own version of a symbol
# another hook may have replaced reads it here (mhc.py: the post half of a fused post+pre)
ORIGINALS: dict[str, Any] = {}

# the SGLang environment switches' patches on vLLM (their `VllmDelivery`'s evidence)
SGLANG_SWITCH = ("an SGLang environment switch; vLLM's counterparts are config settings, "
                 "bisected as settings (`dsv4bisect switches --engine vllm`, "
                 "`bisect --good-config/--bad-config`)")
