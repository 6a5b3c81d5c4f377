"""Embedded-layout and SGLang-layout kernels, each Triton kernel beside its PyTorch reference."""
