"""Prefill/decode disaggregation of the embedded engine (docs/reference-engine.md, "PD
disaggregation"): SGLang's `--disaggregation-mode prefill|decode` servers, the request state they
move (`state.py`), the decode server's state pool (`slots.py`), the transfer backends over TCP
(`wire.py`, `transfer.py`), the two roles around the scheduler (`roles.py`) and the router
(`router_args.py`, `router.py`; torch-free)."""
