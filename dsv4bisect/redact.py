"""The one redaction policy for every output: terminal, JSON, markdown, reports, diffs, logs.

Two passes, because a secret reaches output in two ways:

1. *By position*: the value of a secret-named env var (`HF_TOKEN`, `OPENAI_API_KEY`, ...), of
   a secret-named flag (`--api-key X`, `--hf-token=X`), of a secret-named key in a JSON record,
   or of `KEY=value` text whose key is secret-named (`--set engine.env.HF_TOKEN=...`).
2. *By value*: the same string copied anywhere else (a fingerprint's `identity`, provenance,
   a reproduce command, a log line). Every string in the output has each known secret value
   (≥ 4 characters, so that `***` does not eat ordinary words) replaced by `***`.

`redact(data)` collects the secrets of `data` itself (pass 1) and then scrubs every string
(pass 2); callers holding the unredacted source (e.g. a run's config.json) pass its secrets in.
Names that only *name* an env var (`api_key_env: SGLANG_API_KEY`) are not secrets, nor is a
plain number under a name that counts (`--max-total-tokens 4096`, `prompt_tokens: 12`,
`NUM_KEYS=16`: a count word or the plural TOKENS); under any other secret name a number is a
credential like any value (`API_KEY=12345678`). A URL's password (`postgres://user:pw@host`) is a
secret wherever the URL appears, and so is the value after a secret flag inside free text (a
test command `./tc.sh --api-key X`, a `--set engine.args=[--api-key, X]`), by position only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from dsv4bisect.env import is_secret as _env_is_secret

REDACTED = "***"
MIN_SECRET = 4  # shorter values are hidden by position only
_EXTRA_MARKERS = ("PASSWD", "PASSPHRASE", "CREDENTIAL", "AUTHORIZATION", "COOKIE", "BEARER",
                  "JWT", "SIGNATURE", "PRIVATE", "HMAC", "SESSION")
# `AUTH` as a word of the name (`AUTH`, `BASIC_AUTH`, `AUTH_HEADER`, `PROXY_AUTHTOKEN`), not
# inside another word (`AUTHOR`); `PWD` as a word of a longer name (`DB_PWD`; the shell's `PWD`
# is a directory). Not `PASS`: `--false-pass 0.05` is a rate.
_AUTH_WORD = re.compile(r"(?:^|_)(?:AUTH|AUTHN|AUTHZ|AUTHTOKEN|OAUTH)(?:_|$)|_PWD(?:_|$)")
# A word that makes a secret-marked name a count or a size (`MAX_TOTAL_TOKENS`, `NUM_KEYS`,
# `TOKEN_BUDGET`): its plain-number value is shown. So is the plural TOKENS (`prompt_tokens`).
_COUNT_WORDS = frozenset({"MAX", "MIN", "NUM", "TOTAL", "COUNT", "BUDGET", "LIMIT", "SIZE",
                          "LEN", "LENGTH", "PER", "RATE", "TOKENS"})
# A secret flag and the value after it inside free text: `--api-key X`, `"--api-key", "X"`,
# `[--api-key, X]` (`--api-key=X` is `_ASSIGN`'s). The value does not start with `-` (a flag).
_FLAG_VALUE = re.compile(r"(?P<flag>--[A-Za-z0-9][A-Za-z0-9_\-]*)(?P<sep>[\"']?(?:\s*,\s*|\s+)"
                         r"[\"']?)(?P<value>[^\s,\"'\[\]\-][^\s,\"'\[\]]*)")
# `NAME=value` / `--flag=value` inside free text; the name may be dotted (`engine.env.X_TOKEN`).
_ASSIGN = re.compile(r"(?P<name>[A-Za-z0-9_.\-]+)=(?P<value>[^\s'\"]+)")
# The password of a URL's userinfo: scheme://user:PASSWORD@host.
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^\s/:@'\"]*:)"
                           r"(?P<value>[^\s/@'\"]+)(?P<tail>@)")
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def is_secret(name: str) -> bool:
    """Env var, flag or JSON key whose value must not be shown (TOKEN, KEY, SECRET, ..., and
    their plurals: `HF_TOKENS`, `KEYS`, `GITHUB_TOKENS_FILE`)."""
    if name.endswith(("_env", "_ENV")):  # holds the *name* of a variable (api_key_env)
        return False
    last = re.split(r"[.\s]", name.strip())[-1] if name.strip() else name
    upper = last.upper().replace("-", "_")
    return _env_is_secret(last) or any(m in upper for m in _EXTRA_MARKERS) \
        or bool(_AUTH_WORD.search(upper))


def plain_number(value: str) -> bool:
    """`4096`, `-1`, `0.5`, `1e-3`."""
    return bool(_PLAIN_NUMBER.fullmatch(value.strip()))


def counts(name: str) -> bool:
    """A secret-marked name that holds a count or a size, never a credential."""
    return bool(set(re.split(r"[_\-.\s]+", name.strip("-").upper())) & _COUNT_WORDS)


def shown_number(name: str, value: str) -> bool:
    """A plain number under a name that counts: shown (`--max-total-tokens 4096`)."""
    return plain_number(value) and counts(name)


# Our own record fields that carry a marker but name no secret: a diff row's `key` / `keys`,
# a trial's `signature` / `signatures` (lower case, as our records spell them; the env names
# `KEYS`, `REQ_SIGNATURE` are secrets).
_NOT_SECRET_KEY = re.compile(r"keys?|signatures?")


def is_secret_key(name: str) -> bool:
    """A JSON/YAML record key whose string value is a secret (env names, `api_key`, ...).
    Token-count keys (`prompt_tokens`, `max_total_tokens`) hold numbers, which never are."""
    return is_secret(name) and not _NOT_SECRET_KEY.fullmatch(name)


def _secret_value(name: str, value: Any) -> bool:
    """Whether `value`, under the secret name `name`, is to be hidden: any text, digits too,
    but a count's. JSON numbers are never credentials (`eos_token_id: 1`); an env value or an
    argument is always text (`API_KEY: 12345678` in a profile is the string "12345678")."""
    return isinstance(value, str) and bool(value) and not shown_number(name, value)


def _walk_argv(argv: Iterable[str]) -> Iterator[tuple[str, str | None]]:
    """Each argument with the secret it holds: `--api-key=X` holds X, the argument after
    `--api-key` is itself the secret; any other argument holds none."""
    hide_next = ""  # the secret flag whose value comes next
    for arg in argv:
        if hide_next and not arg.startswith("--"):  # a flag after a secret flag is no value
            flag, hide_next = hide_next, ""
            yield arg, None if shown_number(flag, arg) else arg
        elif arg.startswith("-") and is_secret(name := arg.lstrip("-").split("=", 1)[0]):
            hide_next = name if "=" not in arg else ""
            value = None if hide_next else arg.split("=", 1)[1]
            yield arg, None if not value or shown_number(name, value) else value
        else:
            hide_next = ""
            yield arg, None


def argv_secrets(argv: Iterable[str]) -> list[str]:
    """Values of secret flags in an argv: `--api-key X` and `--api-key=X`."""
    return [secret for _, secret in _walk_argv(argv) if secret is not None]


def redact_argv(argv: Iterable[str]) -> list[str]:
    """The argv with the values of secret flags replaced by `***`."""
    return [arg if secret is None else arg[:len(arg) - len(secret)] + REDACTED
            for arg, secret in _walk_argv(argv)]


def env_secrets(*envs: Mapping[str, str]) -> list[str]:
    return [v for env in envs for k, v in env.items()
            if is_secret(str(k)) and _secret_value(str(k), v)]


def secrets_in(data: Any) -> set[str]:
    """Every secret value found by position in nested JSON-like data (dicts, lists, strings)."""
    found: set[str] = set()
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            for key, value in item.items():
                if is_secret_key(str(key)) and _secret_value(str(key), value):
                    found.add(value)
                stack.append(value)
        elif isinstance(item, (list, tuple)):
            strings = [x for x in item if isinstance(x, str)]
            if len(strings) == len(item) and len(item) == 2 and is_secret(strings[0]) \
                    and _secret_value(strings[0], strings[1]):
                found.add(strings[1])  # an env pair ("HF_TOKEN", "value")
            found.update(argv_secrets(strings))
            stack.extend(item)
        elif isinstance(item, str):
            found.update(_text_secrets(item))
    return {s for s in found if s and s != REDACTED}


def _text_secrets(text: str) -> list[str]:
    found = [m.group("value") for m in _URL_PASSWORD.finditer(text)] if "://" in text else []
    if "=" in text:
        found += [m.group("value") for m in _ASSIGN.finditer(text)
                  if _assigned_secret(m.group("name"), m.group("value"))]
    return found


def _assigned_secret(name: str, value: str) -> bool:
    return is_secret(name) and not shown_number(name, value)


def _flag_secret(flag: str) -> bool:
    """A secret flag's value in free text; not a count's (`--num-draft-tokens to that`)."""
    return is_secret(flag.lstrip("-")) and not counts(flag)


def redact_text(text: str, secrets: Iterable[str]) -> str:
    """`text` with each secret value (longest first) replaced, and `KEY=value` by position."""
    for secret in sorted({s for s in secrets if len(s) >= MIN_SECRET}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    if "://" in text:
        text = _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED + m.group("tail"), text)
    if "=" in text:
        text = _ASSIGN.sub(lambda m: f"{m.group('name')}={REDACTED}"
                           if _assigned_secret(m.group("name"), m.group("value"))
                           else m.group(0), text)
    if "--" in text:
        text = _FLAG_VALUE.sub(lambda m: m.group("flag") + m.group("sep") + REDACTED
                               if _flag_secret(m.group("flag"))
                               and m.group("value") != REDACTED else m.group(0), text)
    return text


def redact(data: Any, extra: Iterable[str] = ()) -> Any:
    """A copy of `data` with every secret hidden, by position and by value."""
    secrets = secrets_in(data) | set(extra)
    return _scrub(data, secrets)


def _scrub(item: Any, secrets: set[str]) -> Any:
    if isinstance(item, Mapping):
        return {key: (REDACTED if is_secret_key(str(key)) and _secret_value(str(key), value)
                      else _scrub(value, secrets)) for key, value in item.items()}
    if isinstance(item, (list, tuple)):
        strings = all(isinstance(x, str) for x in item)
        if strings and len(item) == 2 and is_secret(item[0]) and _secret_value(item[0], item[1]):
            out: list[Any] = [item[0], REDACTED]
        else:
            out = redact_argv(item) if strings else list(item)
            out = [_scrub(x, secrets) for x in out]
        return type(item)(out) if isinstance(item, tuple) else out
    if isinstance(item, str):
        return redact_text(item, secrets)
    return item
