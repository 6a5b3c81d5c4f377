"""What a patch is declared with: the declaration (`spec.py`), the embedded engine's swappable
ops (`swaps.py`) and what a hook planner returns (`plan.py`). Below the patches and above
nothing of dsv4bisect but `base/`: torch-free (docs/patches.md)."""
