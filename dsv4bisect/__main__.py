"""`python -m dsv4bisect`: the same entry point as the `dsv4bisect` console script."""

from __future__ import annotations

from dsv4bisect.cli import main

if __name__ == "__main__":
    main()
