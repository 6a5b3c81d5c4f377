"""Training the embedded engine's checkpoint: a data generator and a training script.

Imports only torch, the model code and the probe's conversation formats, so it runs on a GPU box
that has torch and nothing else of ours installed.
"""
