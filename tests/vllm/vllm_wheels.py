"""The vLLM wheels the slow tests read (never imported, never committed).

One wheel per verified release (`dsv4bisect.base.vllm_releases.VERIFIED`, 240–320 MB each),
downloaded with `pip download --no-deps` into a cache outside the repository
(`$DSV4BISECT_VLLM_WHEELS`, default ~/.cache/dsv4bisect/vllm-wheels), the missing ones in
parallel; only the files a check needs are read from each zip (tests/wheel_cache.py). Named
apart from tests/sglang/wheels.py: both directories' tests run in one process.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: wheel_cache.py

from wheel_cache import WheelCache  # noqa: E402

from dsv4bisect.base.vllm_releases import VERIFIED  # noqa: E402

VERSIONS = VERIFIED
ENV = "DSV4BISECT_VLLM_WHEELS"
CACHE = WheelCache("vllm", VERSIONS, ENV, ".cache/dsv4bisect/vllm-wheels", workers=5,
                   timeout_s=1800)
READ = CACHE.read
fetch_all, fetch_wheel, wheel_of = CACHE.fetch_all, CACHE.fetch_wheel, CACHE.wheel_of
