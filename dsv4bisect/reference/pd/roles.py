"""The two PD roles around one server's scheduler: what `run` does with a request the router
sent (SGLang's `disaggregation/prefill.py` and `decode.py`, reduced to the embedded engine).

- **prefill** (`--disaggregation-mode prefill`): the request runs on its scheduler as any other
  (the prefix cache, chunked prefill and batching of prefills as on a plain server) but stops
  after its first output token; its decoding state — the prompt's KV, state and aux buffers
  (state.py) with that token and its log-probs — goes to the decode server that registered for
  the request's room, by the server's transfer backend (transfer.py). Its own answer (the first
  token, and the input log-probs when asked) goes back to the router.
- **decode** (`--disaggregation-mode decode`): the request takes a slot of the state pool
  (slots.py), registers at the prefill server, writes what arrives into the slot, reads the
  slot back into a cache and decodes from the first token on, batched with every other request
  the server decodes (with speculation when the server speculates: the MTP layer's state came
  in the transfer). It reports no input log-probs; the router joins the prefill server's.

A request without `bootstrap_*` fields is refused on both roles (they serve the router), except
the server's own health check, which runs locally with SGLang's fake bootstrap host. The
`stale-slot` fault (transfer.py names it) acts here, on the decode side: the receiver writes a
slot's state only while the slot is new, so a reused slot keeps its last occupant's state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from dsv4bisect.reference.cancel import current_check
from dsv4bisect.reference.generation import FirstToken, GenOutput, Generator, GenSpec
from dsv4bisect.reference.pd.slots import StatePool, decode_pool_size, layout
from dsv4bisect.reference.pd.state import AUX, KV, STATE, Header, Payload, export, restore
from dsv4bisect.reference.pd.transfer import (
    STALE_SLOT,
    BootstrapServer,
    TransferFailed,
    TransferStats,
    check_backend,
    receive,
)
from dsv4bisect.reference.request_body import ApiError

PREFILL, DECODE = "prefill", "decode"


def _never() -> bool:
    return False


def _check() -> Callable[[], bool]:
    return current_check() or _never


def _no_tokens(cached: int = 0) -> GenOutput:
    return GenOutput([], "", {"type": "length", "length": 0}, [], [], [], [], [], cached)


class _Role:
    """What the API asks of a generator, around the server's own `Generator`."""

    mode = "null"

    def __init__(self, generator: Generator, backend: str, fault: str | None) -> None:
        check_backend(backend, fault)
        self.gen, self.backend, self.fault = generator, backend, fault
        self.tokenizer, self.engine = generator.tokenizer, generator.engine
        self.scheduler = generator.scheduler

    def run(self, spec: GenSpec) -> GenOutput:
        if spec.bootstrap is None:
            raise ApiError(f"this server runs --disaggregation-mode {self.mode}: send requests "
                           "through the router (bootstrap_host, bootstrap_port and "
                           "bootstrap_room are missing)")
        if spec.bootstrap.fake:  # the server's own health check: no transfer (SGLang's fake
            return self.gen.run(spec)  # bootstrap host); it computes here
        return self._run(spec)

    def _run(self, spec: GenSpec) -> GenOutput:
        raise NotImplementedError

    def flush_cache(self) -> None:
        self.gen.flush_cache()

    @contextmanager
    def drained(self) -> Iterator[None]:
        with self.gen.drained():
            yield

    def stats(self) -> dict[str, Any]:
        return self.gen.stats() | self.transfer_stats().to_json()

    def transfer_stats(self) -> TransferStats:
        raise NotImplementedError


class PrefillRole(_Role):
    mode = PREFILL

    def __init__(self, generator: Generator, backend: str, fault: str | None, host: str,
                 bootstrap_port: int) -> None:
        super().__init__(generator, backend, fault)
        self.bootstrap = BootstrapServer(host, bootstrap_port, backend, fault)

    def transfer_stats(self) -> TransferStats:
        return self.bootstrap.stats

    def close(self) -> None:
        self.bootstrap.close()

    def _run(self, spec: GenSpec) -> GenOutput:
        assert spec.bootstrap is not None
        room = spec.bootstrap.room
        try:
            if spec.max_new_tokens == 0 and not spec.return_logprob:  # no model work
                out, payload = _no_tokens(), Payload(Header(0))
            else:
                out, payload = self._prefill(spec)
            self.bootstrap.send(room, payload, _check())
        except BaseException as exc:
            self.bootstrap.fail(room, f"the prefill failed: {type(exc).__name__}: {exc}")
            if isinstance(exc, TransferFailed):
                raise ApiError(str(exc), 500, "InternalServerError") from None
            raise
        return out

    def _prefill(self, spec: GenSpec) -> tuple[GenOutput, Payload]:
        """The prompt and its first token (SGLang's prefill server stops there)."""
        one = dataclasses.replace(spec, max_new_tokens=min(spec.max_new_tokens, 1))
        out, req = self.gen.run_request(one, keep_cache=True)
        cache = req.cache
        assert cache is not None
        first = req.output_ids[0] if req.output_ids else None
        header = Header(cache.n_tokens, None if cache.mtp is None else cache.mtp.rows, first,
                        req.logprobs[0] if first is not None else 0.0,
                        tuple(req.tops[0]) if first is not None else (), req.cached_tokens)
        return out, export(cache, header)


class DecodeRole(_Role):
    mode = DECODE

    def __init__(self, generator: Generator, backend: str, fault: str | None) -> None:
        super().__init__(generator, backend, fault)
        self.stats_ = TransferStats("decode")
        self.speculates = generator.scheduler.spec is not None
        self.pool = StatePool(decode_pool_size(generator.scheduler.max_running),
                              layout(self.engine.model, self.speculates), self.engine.device)

    def transfer_stats(self) -> TransferStats:
        return self.stats_

    def stats(self) -> dict[str, Any]:
        return super().stats() | self.pool.stats()

    def _run(self, spec: GenSpec) -> GenOutput:
        assert spec.bootstrap is not None
        check = _check()
        slot = self.pool.alloc(check)
        cache = None
        try:
            try:
                payload, record = receive(spec.bootstrap, self.backend, check)
            except TransferFailed as exc:
                raise ApiError(str(exc), 500, "InternalServerError") from None
            header = payload.header
            reused = self.pool.reused(slot)
            if not (self.fault == STALE_SLOT and reused):
                self.pool.write(slot, header, payload.buffers[STATE])
            self.stats_.add(record | {"slot": slot, "slot_reused": reused})
            if spec.max_new_tokens == 0 or header.first_token is None:
                return _no_tokens(header.cached_tokens)
            header = self._mtp(header)
            cache = restore(self.engine.model, header, payload.buffers[KV],
                            self.pool.read(slot, header), payload.buffers[AUX])
            first = FirstToken(header.first_token, header.first_logprob,
                               list(header.first_top), header.cached_tokens)
            out, req = self.gen.resume(spec, cache, first)
            cache = req.cache
            return out
        finally:
            self.pool.release(slot, cache)

    def _mtp(self, header: Header) -> Header:
        """The header as this server reads it: without the MTP state when it does not
        speculate; an error when it speculates and the prefill server sent none."""
        if not self.speculates:
            return dataclasses.replace(header, mtp_rows=None)
        if header.mtp_rows is None:
            raise ApiError("this decode server speculates and the transfer carries no MTP "
                           "state: run the prefill server with the same --speculative-* "
                           "arguments", 500, "InternalServerError")
        return header


def make_role(mode: str, generator: Generator, backend: str, fault: str | None, host: str,
              bootstrap_port: int) -> PrefillRole | DecodeRole:
    if mode == PREFILL:
        return PrefillRole(generator, backend, fault, host, bootstrap_port)
    if mode == DECODE:
        return DecodeRole(generator, backend, fault)
    raise ValueError(f"unknown disaggregation mode {mode!r}")
