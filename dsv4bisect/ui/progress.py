"""Labels of the probe's progress lines, one wording for `run`, `bisect` and `probe`.

A probe stage first builds its prompts (each case's conversation, token-counted against the
server's tokenizer), then sends its requests: `baseline prompts: 40/40`, then
`baseline requests: 40/40 1,234 tok/s acc 92%`.
"""

from __future__ import annotations


def stage_label(stage: str, phase: str) -> str:
    return f"{stage} {'prompts' if phase == 'build' else 'requests'}"


def ready_detail(line: str) -> str:
    """An engine's last log line as shown beside its state: the embedded engine's own
    `ready: ...` line loses its `ready:` (the state already says it)."""
    text = line.replace("\r", " ").strip()
    return text.removeprefix("ready:").strip()
