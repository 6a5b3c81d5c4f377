"""Imports for the standalone GPU scripts of this directory, run as `python tests/sglang/X.py` on
a machine where dsv4bisect may not be installed: the checkout and this directory on sys.path, and
patches/ and kernels/ found at the top of a plain checkout (they install under the package)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))
import dsv4bisect  # noqa: E402

try:
    import dsv4bisect.kernels  # noqa: F401
except ImportError:  # a plain checkout: patches/ and kernels/ live at the top
    dsv4bisect.__path__.append(str(ROOT))
