"""Trials on the nodes of a Ray cluster (docs/cluster.md): the executor, its node slots, and what
a node is sent and sends back. ray_executor.py and slots.py are the only Ray imports."""
