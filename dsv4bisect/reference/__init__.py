"""The embedded engine: a faithful small DeepSeek-V4 in PyTorch, served over SGLang's API subset."""
