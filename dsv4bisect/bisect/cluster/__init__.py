"""Trials on the nodes of a Ray cluster (docs/cluster.md): the executor, and what a node is
sent and sends back. The only Ray import."""
