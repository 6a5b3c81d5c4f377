"""One row of a node's checks, `Finding`: what preflight.py (SGLang) and vllm_checks.py (vLLM)
return and `doctor` shows; apart from both because preflight.py runs vllm_checks.py."""

from __future__ import annotations

from dataclasses import dataclass

from dsv4bisect.errors import ConfigError, Dsv4BisectError, EngineError

SKIP_HINT = "or pass --skip-preflight if you know better"


@dataclass(frozen=True)
class Finding:
    """One check. `status`: ok | warn | fail | skip (warn: doctor's rows only). A failure is
    transient (exit 125) when someone else holds what we need (a port, a GPU); otherwise it is a
    setup to fix (exit 5)."""

    check: str
    status: str
    detail: str
    hint: str = ""
    transient: bool = False

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    def error(self) -> Dsv4BisectError:
        hint = f"{self.hint} ({SKIP_HINT})" if self.hint else SKIP_HINT
        cls = EngineError if self.transient else ConfigError
        return cls(f"preflight: {self.detail}", hint)
