"""`ReferenceEngine`: greedy generation and teacher-forced scoring on the embedded DeepSeek-V4.

The engine owns one model with one patch set (`Numerics`) fixed at load. A request prefills its
prompt in chunks of `chunk_size` tokens (compressed entries completed inside a chunk are visible
to the chunk's later tokens, compression state carries across chunks), then decodes one token per
step with the same cache. Nothing is kept between requests. Not thread-safe: callers serialise.
On CPU every run of the same request is bit-for-bit identical (same thread count).

`generate` / `score` run one request (a batch of one) for direct callers (tests, microtests,
training tools); the server batches requests and reuses prefixes through
`reference/scheduler.py`, which runs the same model steps.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch

from dsv4bisect.errors import ConfigError, Dsv4BisectError, EngineError, ExitCode
from dsv4bisect.reference.cancel import StopCheck
from dsv4bisect.reference.cancel import raise_if_stopped as _check
from dsv4bisect.reference.checkpoint import load_model, random_model
from dsv4bisect.reference.config import ModelArgs, Numerics
from dsv4bisect.reference.model import Transformer

DEFAULT_MAX_MODEL_LEN = 32768  # cap when the checkpoint allows more (RoPE goes to 1M positions)
RANDOM_SEED = 0
# CPU threads when `threads` is None. One: on the shared 2-core machines this runs on, more
# threads than idle cores make every OpenMP region wait for a descheduled thread (measured: 8k
# prefill 6 s with 1 thread vs 106 s with 2 at load ~4), and bisect runs engines side by side.
DEFAULT_CPU_THREADS = 1


class RequestError(Dsv4BisectError, ValueError):
    """A generate/score request the engine cannot serve (bad ids, too long, bad options)."""

    exit_code = ExitCode.BAD_INPUT


@dataclass(frozen=True)
class Generation:
    output_ids: list[int]
    logprobs: list[float]  # log-prob of each output token under the model
    top_logprobs: list[list[tuple[int, float]]]  # per output token: (id, log-prob), best first
    finish_reason: str  # "stop" (a stop id was produced, and is included) | "length"


@dataclass(frozen=True)
class TokenScore:
    position: int  # index i into input_ids
    token_id: int  # input_ids[i]
    logprob: float  # log p(input_ids[i] | input_ids[:i])
    top: list[tuple[int, float]]  # the top alternatives at position i, best first


@cache
def engine_code_version() -> str:
    """Hash of the sources that decide the engine's numerics (reference/*.py, kernels/*.py,
    and patches/*.py, whose swaps the model runs)."""
    from dsv4bisect import kernels, patches

    digest = hashlib.sha256()
    for folder in (Path(__file__).parent, Path(kernels.__file__).parent,
                   Path(patches.__file__).parent):
        for file in sorted(folder.glob("*.py")):
            digest.update(f"{folder.name}/{file.name}\0".encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        return torch.device("cpu")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise EngineError(
                f"device `{device}` requested but CUDA is not available",
                "use --device cpu (or auto)",
            )
        return torch.device(device)
    raise ConfigError(f"unknown device `{device}`", "use auto, cpu or cuda[:N]")


class ReferenceEngine:
    """The embedded engine. Build with `ReferenceEngine.load`."""

    def __init__(
        self,
        model: Transformer,
        numerics: Numerics,
        *,
        chunk_size: int,
        max_model_len: int,
        source: str,
    ) -> None:
        self.model, self.numerics = model, numerics
        self.chunk_size, self._max_model_len, self.source = chunk_size, max_model_len, source
        self.device = model.embed.weight.device

    @classmethod
    def load(
        cls,
        checkpoint: str | Path | None,
        *,
        patches: Mapping[str, str] | None = None,
        moe_backend: str = "triton",
        precision: str = "deployment",
        chunk_size: int = 2048,
        device: str = "auto",
        threads: int | None = None,
        max_model_len: int | None = None,
        mtp: bool = False,
    ) -> ReferenceEngine:
        """Load a checkpoint directory (None: the random `tiny` model from seed 0) with a patch
        set (name -> variant; PatchError for unknown ones), the profile's MoE backend and the
        precision (`deployment`: the seed deployment's NVFP4 / FP8 formats; `exact`: fp32, see
        docs/reference-engine.md). `threads` sets torch's CPU threads for the process (None: 1
        on CPU). `mtp`: also load the checkpoint's MTP layer (speculative decoding; a
        ConfigError when it has none; the random model always has its random one)."""
        numerics = Numerics.from_patches(patches or {}, moe_backend, precision=precision)
        if not isinstance(chunk_size, int) or chunk_size <= 0:
            raise ConfigError(f"chunk_size must be a positive integer, got {chunk_size!r}")
        if threads is not None and (not _is_int(threads) or threads <= 0):
            raise ConfigError(f"threads must be a positive integer, got {threads!r}")
        dev = resolve_device(device)
        if threads is None and dev.type == "cpu":
            threads = DEFAULT_CPU_THREADS
        if threads is not None:
            torch.set_num_threads(threads)  # process-wide
        if checkpoint is None:
            model = random_model(ModelArgs.preset("tiny"), RANDOM_SEED, dev)
            source = f"random tiny DeepSeek-V4 (seed {RANDOM_SEED})"
        else:
            model = load_model(checkpoint, dev, mtp=mtp)
            source = str(Path(checkpoint).resolve())
        model.configure(numerics)
        limit = model.a.max_position_embeddings
        mml = min(limit, DEFAULT_MAX_MODEL_LEN) if max_model_len is None else max_model_len
        if not isinstance(mml, int) or not 0 < mml <= limit:
            raise ConfigError(f"max_model_len must be in 1..{limit}, got {max_model_len!r}")
        return cls(model, numerics, chunk_size=chunk_size, max_model_len=mml, source=source)

    def switch(self, patches: Mapping[str, str]) -> None:
        """Install another patch set in the loaded model, as a fresh load with it would
        (PatchError for unknown patches). Callers hold the engine (no request running)."""
        numerics = Numerics.from_patches(patches, self.numerics.moe_backend,
                                         self.numerics.nvfp4_layers, self.numerics.precision)
        self.model.configure(numerics)
        self.numerics = numerics

    # ---- description ----------------------------------------------------------------------------
    @property
    def config(self) -> ModelArgs:
        return self.model.a

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    def info(self) -> dict[str, Any]:
        return {
            "model": self.source,
            "config": self.config.to_hf_config(),
            "compress_ratios": list(self.config.compress_ratios),
            "sliding_window": self.config.sliding_window,
            "device": str(self.device),
            "dtype": "float32",
            "precision": self.numerics.precision,
            "torch_version": torch.__version__,
            "engine_version": engine_code_version(),
            "patches": dict(self.numerics.patches),
            "moe_backend": self.numerics.moe_backend,
            "chunk_size": self.chunk_size,
            "max_model_len": self.max_model_len,
            "threads": torch.get_num_threads(),
        }

    # ---- requests -------------------------------------------------------------------------------
    def generate(
        self,
        input_ids: Sequence[int],
        *,
        max_new_tokens: int,
        stop_ids: Sequence[int] | None = None,
        top_logprobs: int = 0,
        should_stop: StopCheck | None = None,
    ) -> Generation:
        """Greedy decoding (ties -> lowest id). The stop token, when produced, is included.
        `should_stop` is polled before every prefill chunk and decode step (Cancelled if true);
        it only decides whether the next step runs, never what a step computes."""
        if not _is_int(max_new_tokens) or max_new_tokens < 0:
            raise RequestError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        ids = self._check_ids(input_ids, max_new_tokens)
        k = self._check_top(top_logprobs)
        stop = {self.config.eos_token_id} if stop_ids is None else set(self._check_stop(stop_ids))
        if max_new_tokens == 0:
            return Generation([], [], [], "length")
        with torch.inference_mode():
            cache = self.model.new_cache()
            logits = self.model.logits(self._prefill(ids, cache, should_stop)[-1:])  # [1, V]
            with single_thread():
                return self._decode(logits, cache, max_new_tokens, stop, k, should_stop)

    def _decode(
        self, logits: torch.Tensor, cache: Any, max_new_tokens: int, stop: set[int], k: int,
        should_stop: StopCheck | None = None,
    ) -> Generation:
        out: list[int] = []
        lps: list[float] = []
        tops: list[list[tuple[int, float]]] = []
        while True:
            lp = torch.log_softmax(logits[0], -1)
            token = int(torch.argmax(logits[0]))  # first maximum: the lowest id
            out.append(token)
            lps.append(float(lp[token]))
            tops.append(top_alternatives(logits[:1], lp[None], k)[0])
            if token in stop:
                return Generation(out, lps, tops, "stop")
            if len(out) == max_new_tokens:
                return Generation(out, lps, tops, "length")
            _check(should_stop)
            logits = self.decode_step(token, cache)

    def decode_step(self, token: int, cache: Any) -> torch.Tensor:
        """One token through the model with the cache -> logits [1, V]."""
        step = torch.tensor([token], device=self.device)
        return self.model.logits(self.model.forward_hidden(step, cache))

    def score(
        self, input_ids: Sequence[int], *, start: int, top_logprobs: int = 0,
        should_stop: StopCheck | None = None,
    ) -> list[TokenScore]:
        """Teacher-forced log p(input_ids[i] | input_ids[:i]) for i >= max(start, 1), with the
        top alternatives at each position (SGLang /generate with logprob_start_len = start).
        `should_stop` is polled before every chunk, as in `generate`."""
        if not _is_int(start) or start < 0:
            raise RequestError(f"start must be an integer >= 0, got {start!r}")
        ids = self._check_ids(input_ids, 0)
        k = self._check_top(top_logprobs)
        first, n = max(start, 1), len(ids)
        scores: list[TokenScore] = []
        if first >= n:
            return scores
        with torch.inference_mode():
            cache = self.model.new_cache()
            tokens = torch.tensor(ids, device=self.device)
            for s in range(0, n - 1, self.chunk_size):  # the last token predicts nothing needed
                e = min(s + self.chunk_size, n - 1)
                _check(should_stop)
                h = self.model.forward_hidden(tokens[s:e], cache)  # rows predict tokens s+1..e
                lo = max(first - 1 - s, 0)
                if lo >= e - s:
                    continue
                logits = self.model.logits(h[lo:])  # predicts positions s+1+lo .. e
                lp = torch.log_softmax(logits, -1)
                targets = tokens[s + 1 + lo : e + 1]
                chosen = lp.gather(1, targets[:, None])[:, 0].tolist()
                top = top_alternatives(logits, lp, k)
                for j, (t, v) in enumerate(zip(targets.tolist(), chosen, strict=True)):
                    scores.append(TokenScore(s + 1 + lo + j, t, v, top[j]))
        return scores

    def check_request(
        self, input_ids: Sequence[int], max_new_tokens: int, top_logprobs: int,
        stop_ids: Sequence[int],
    ) -> None:
        """RequestError for what `generate` would refuse (the scheduler's callers check here)."""
        if not _is_int(max_new_tokens) or max_new_tokens < 0:
            raise RequestError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        self._check_ids(input_ids, max_new_tokens)
        self._check_top(top_logprobs)
        self._check_stop(stop_ids)

    # ---- helpers --------------------------------------------------------------------------------
    def _prefill(
        self, ids: list[int], cache: Any, should_stop: StopCheck | None = None
    ) -> torch.Tensor:
        """Run the prompt in chunks; returns the last chunk's final streams [T, n, dim]."""
        tokens = torch.tensor(ids, device=self.device)
        h = None
        for s in range(0, len(ids), self.chunk_size):
            _check(should_stop)
            h = self.model.forward_hidden(tokens[s : s + self.chunk_size], cache)
        assert h is not None  # ids is non-empty (checked)
        return h

    def _check_ids(self, input_ids: Sequence[int], extra: int) -> list[int]:
        if isinstance(input_ids, str | bytes) or not isinstance(input_ids, Sequence):
            raise RequestError("input_ids must be a list of token ids")
        ids = list(input_ids)
        if not ids:
            raise RequestError("input_ids is empty", "send at least one token")
        vocab = self.config.vocab_size
        bad = next((t for t in ids if not _is_int(t) or not 0 <= t < vocab), None)
        if bad is not None:
            raise RequestError(f"token id {bad!r} is not in the vocabulary (0..{vocab - 1})")
        if len(ids) + extra > self.max_model_len:
            raise RequestError(
                f"{len(ids)} prompt tokens + {extra} new tokens exceed max_model_len "
                f"{self.max_model_len}",
                "shorten the prompt or lower max_new_tokens",
            )
        return ids

    def _check_top(self, k: int) -> int:
        if not _is_int(k) or not 0 <= k <= self.config.vocab_size:
            raise RequestError(f"top_logprobs must be in 0..{self.config.vocab_size}, got {k!r}")
        return k

    def _check_stop(self, stop_ids: Sequence[int]) -> list[int]:
        if isinstance(stop_ids, str | bytes) or not isinstance(
            stop_ids, Sequence | set | frozenset
        ):
            raise RequestError("stop_ids must be a list of token ids")
        if not all(_is_int(t) for t in stop_ids):
            raise RequestError("stop_ids must be integers")
        return list(stop_ids)


@contextmanager
def single_thread() -> Iterator[None]:
    """Decode steps run one token: their ops are too small to split across CPU threads, and
    with more threads than idle cores each parallel region waits for a descheduled thread
    (measured 5-10x slower per step on a loaded 2-core machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def top_alternatives(
    logits: torch.Tensor, lp: torch.Tensor, k: int
) -> list[list[tuple[int, float]]]:
    """Per row the k best ids by logit (stable: ties -> lower id) with their log-probs."""
    if k == 0:
        return [[] for _ in range(logits.shape[0])]
    order = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :k]
    values = lp.gather(1, order)
    return [
        list(zip(o, v, strict=True)) for o, v in zip(order.tolist(), values.tolist(), strict=True)
    ]
