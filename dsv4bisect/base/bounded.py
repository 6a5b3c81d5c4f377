"""The one loader for every file dsv4bisect reads: bounded, strictly UTF-8, errors with positions.

Every profile, run-directory JSON, checkpoint `config.json` and shard index goes through here,
and so does every file of an SGLang wheel or source tree (`--sglang-src`: plugin/static.py),
so no input can make the tool recurse past Python's stack, grow without bound (YAML alias
"billion laughs"), decode garbage, or escape as a traceback. Limits are sized per kind of file
(`LIMITS`): a real DeepSeek-V4-Flash `model.safetensors.index.json` (a weight map of ~10⁵
entries, ~10 MB) loads; a 600-deep profile or a 5000-deep `--set` value does not.

Why these checks run *before* the parsers: PyYAML's composer and constructor, and CPython's
json decoder, are recursive, and PyYAML expands aliases into shared objects whose later walk
(validation, deepcopy, dump) is exponential. The YAML pre-pass walks the event stream, which
PyYAML produces iteratively, so depth, node count and anchors are checked at constant stack.
"""

from __future__ import annotations

import ast
import json
import os
import re
import stat
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dsv4bisect.errors import ConfigError

MiB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """What one kind of file may hold; anything beyond is a ConfigError naming the limit."""

    kind: str  # shown in errors: "profile", "run file", ...
    max_bytes: int
    max_depth: int  # nesting of mappings/sequences (objects/arrays)
    max_nodes: int  # scalars + collections in the whole document
    max_keys: int  # keys of one mapping
    hint: str


LIMITS: dict[str, Limits] = {
    # Profiles are hand-written: the shipped ones are < 4 KiB and 5 levels deep.
    "profile": Limits("profile", 1 * MiB, 24, 50_000, 5_000,
                      "profiles are small hand-written YAML; start from `dsv4bisect profile new`"),
    # A `--set` value is one scalar or flow collection.
    "override": Limits("--set value", 64 * 1024, 16, 5_000, 1_000,
                       "a --set value is a scalar or a short flow list/mapping"),
    # run.json, verdict.json, config.json, bisect.json, meta.json of run directories.
    "run": Limits("run file", 64 * MiB, 64, 2_000_000, 200_000,
                  "was this file written by dsv4bisect? re-run the command to rewrite it"),
    # Probe rows, cases and drift records (.jsonl): one document per line, long contexts.
    "jsonl": Limits("probe record file", 4096 * MiB, 32, 10_000_000, 100_000,
                    "was this directory written by dsv4bisect? re-run the probe"),
    # A checkpoint's config.json (the HF DeepSeek-V4 config is ~3 KiB, 3 levels).
    "checkpoint-config": Limits("checkpoint config.json", 4 * MiB, 32, 200_000, 50_000,
                                "pass a DeepSeek-format checkpoint directory"),
    # model.safetensors.index.json: V4-Flash's weight map has ~10⁵ entries (~10 MB); allow
    # an order of magnitude more before calling it hostile.
    "checkpoint-index": Limits("checkpoint index", 256 * MiB, 8, 5_000_000, 4_000_000,
                               "pass a DeepSeek-format checkpoint directory"),
    # One .py file of an SGLang wheel or tree. The largest of the verified releases is 413 KiB
    # (`srt/server_args.py`, 0.5.17) and their deepest syntax tree 39 levels; depth here is the
    # syntax tree's, nodes its node count. Deeper trees would overflow the recursive AST walks.
    "source": Limits("Python source file", 8 * MiB, 200, 2_000_000, 0,
                     "--sglang-src takes an SGLang wheel or a directory holding sglang/; "
                     "this file is not one SGLang would ship"),
}

# An archive (an SGLang wheel): the verified releases hold at most 4 317 entries and 69 MiB
# uncompressed (41 MiB of .py). Sizes are the ones the archive declares, checked before
# anything is decompressed; a member is then read only up to its kind's limit, so a member
# that declares less than it holds (a zip bomb) fails its read instead of filling memory.
MAX_ARCHIVE_ENTRIES = 100_000
MAX_ARCHIVE_BYTES = 1024 * MiB

# A plain YAML scalar made of this many digits is not a setting anyone means; CPython refuses
# to convert > 4300 digits to int (ValueError from deep inside PyYAML's constructor).
MAX_NUMBER_CHARS = 64
_NUMBERISH = re.compile(r"[-+]?[0-9_.,:eE]+")


def _limits(kind: str) -> Limits:
    return LIMITS[kind]


# ---- bytes → text ------------------------------------------------------------------------------

def read_text(path: Path, kind: str, *, shown: str | None = None) -> str:
    """The file's text: at most the kind's size, strict UTF-8, no NUL; else a positioned error."""
    shown = shown or str(path)
    return decode(read_bytes(path, kind, shown=shown), shown)


def read_bytes(path: Path, kind: str, *, shown: str | None = None) -> bytes:
    """The file's bytes, at most the kind's size (for hashing a model's identity files)."""
    limits = _limits(kind)
    shown = shown or str(path)
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever
        # (a FIFO planted as run.json hung every command that reads the runs root).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise ConfigError(f"{shown}: not a regular file ({_file_type(mode)})",
                                  "dsv4bisect reads regular files only; give the path of one")
            # Read one byte past the limit instead of trusting stat(): /proc files report 0.
            data = f.read(limits.max_bytes + 1)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(f"{shown}: cannot read: {reason}", "check the path") from None
    if len(data) > limits.max_bytes:
        raise ConfigError(f"{shown}: larger than the {_size(limits.max_bytes)} a {limits.kind} "
                          "may be", limits.hint)
    return data


def _file_type(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a plain file"


def decode(data: bytes, shown: str) -> str:
    """Strict UTF-8 (a UTF-8 BOM is allowed); UTF-16/32, NUL and binary are `file:line:col`."""
    if data[:2] in (b"\xff\xfe", b"\xfe\xff") or data[:4] in (b"\x00\x00\xfe\xff",):
        raise ConfigError(f"{shown}:1:1: the file is UTF-16/UTF-32 text, not UTF-8",
                          "save it as UTF-8 (e.g. `iconv -f UTF-16 -t UTF-8`)")
    binary = "dsv4bisect reads UTF-8 text files; is this a binary file?"
    nul = data.find(b"\0")  # whichever problem comes first in the file is the one reported
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if not 0 <= nul < exc.start:
            line, col = _line_col(data, exc.start)
            raise ConfigError(f"{shown}:{line}:{col}: not UTF-8 text (byte "
                              f"0x{data[exc.start]:02x})", binary) from None
    if nul >= 0:
        line, col = _line_col(data, nul)
        raise ConfigError(f"{shown}:{line}:{col}: NUL byte in a text file", binary)
    return text.removeprefix("\ufeff")


def _line_col(buf: bytes | str, index: int) -> tuple[int, int]:
    newline = b"\n" if isinstance(buf, bytes) else "\n"
    line = buf.count(newline, 0, index) + 1  # type: ignore[arg-type]
    start = buf.rfind(newline, 0, index) + 1  # type: ignore[arg-type]
    return line, index - start + 1


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else f"{n // 1024} KiB"


# ---- archives and Python source ----------------------------------------------------------------

def open_archive(path: Path, hint: str) -> zipfile.ZipFile:
    """A zip file whose central directory is within MAX_ARCHIVE_ENTRIES entries and
    MAX_ARCHIVE_BYTES declared uncompressed bytes."""
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read it as a zip archive: {_clip(str(exc))}",
                          hint) from None
    infos = archive.infolist()
    total = sum(i.file_size for i in infos)
    if len(infos) > MAX_ARCHIVE_ENTRIES or total > MAX_ARCHIVE_BYTES:
        archive.close()
        raise ConfigError(f"{path}: declares {_size(total)} uncompressed in {len(infos)} files "
                          f"(an archive read here may hold {_size(MAX_ARCHIVE_BYTES)} in "
                          f"{MAX_ARCHIVE_ENTRIES} files; a real SGLang wheel is under 100 MiB)",
                          hint)
    return archive


def read_member(archive: zipfile.ZipFile, name: str, kind: str) -> bytes:
    """One member's bytes, at most the kind's size whatever the archive declares."""
    limits = _limits(kind)
    shown = f"{archive.filename}:{name}"
    info = archive.getinfo(name)
    if info.file_size > limits.max_bytes:
        raise ConfigError(f"{shown}: {_size(info.file_size)} uncompressed, larger than the "
                          f"{_size(limits.max_bytes)} a {limits.kind} may be", limits.hint)
    try:
        with archive.open(info) as member:
            data = member.read(limits.max_bytes + 1)
    except (OSError, zipfile.BadZipFile, EOFError, ValueError, NotImplementedError) as exc:
        raise ConfigError(f"{shown}: cannot decompress it: {_clip(str(exc))}",
                          limits.hint) from None
    if len(data) > limits.max_bytes:
        raise ConfigError(f"{shown}: decompresses past the {_size(limits.max_bytes)} a "
                          f"{limits.kind} may be", limits.hint)
    return data


def parse_python(text: str, kind: str, shown: str) -> ast.Module:
    """ast.parse within the kind's depth and node limits. A SyntaxError is the caller's (a
    release may ship a broken file); what the parser cannot build (an expression of 10⁵ terms
    exhausts its recursion) or what the recursive AST walks could not visit is a ConfigError."""
    limits = _limits(kind)
    try:
        tree = ast.parse(text)
    except (RecursionError, MemoryError) as exc:
        raise ConfigError(f"{shown}: too deeply nested for Python's parser ({type(exc).__name__})",
                          limits.hint) from None
    nodes, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if depth > limits.max_depth or nodes > limits.max_nodes:
            where = getattr(node, "lineno", 1)
            what = (f"nested deeper than {limits.max_depth} levels" if depth > limits.max_depth
                    else f"more than {limits.max_nodes} syntax nodes")
            raise ConfigError(f"{shown}:{where}: {what} (the most a {limits.kind} may have)",
                              limits.hint)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return tree


# ---- JSON --------------------------------------------------------------------------------------

# Strings (with escapes) or a bracket: depth is counted on brackets outside strings only.
_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def load_json(path: Path, kind: str, *, shown: str | None = None) -> Any:
    shown = shown or str(path)
    return parse_json(read_text(path, kind, shown=shown), kind, shown)


def load_jsonl(path: Path, kind: str = "jsonl") -> list[Any]:
    """One JSON document per non-empty line, each bounded like a whole file of `kind`."""
    shown = str(path)
    out = []
    for number, line in enumerate(read_text(path, kind, shown=shown).splitlines(), 1):
        if line.strip():
            out.append(parse_json(line, kind, f"{shown}:{number}"))
    return out


def parse_json(text: str, kind: str, shown: str) -> Any:
    """json.loads with the kind's depth, node and key limits; NaN/Infinity are refused."""
    limits = _limits(kind)
    depth = 0
    for match in _JSON_TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > limits.max_depth:
                line, col = _line_col(text, match.start())
                raise ConfigError(f"{shown}:{line}:{col}: nested deeper than {limits.max_depth} "
                                  f"levels (the most a {limits.kind} may have)", limits.hint)
        elif token in "]}":
            depth -= 1
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{shown}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}",
                          limits.hint) from None
    except (ValueError, RecursionError) as exc:  # e.g. a 5000-digit integer, NaN
        raise ConfigError(f"{shown}: not valid JSON: {_clip(str(exc))}", limits.hint) from None
    _check_size(data, limits, shown)
    return data


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _check_size(data: Any, limits: Limits, shown: str) -> None:
    nodes = 0
    stack = [data]
    while stack:
        item = stack.pop()
        nodes += 1
        if nodes > limits.max_nodes:
            raise ConfigError(f"{shown}: more than {limits.max_nodes} values (the most a "
                              f"{limits.kind} may hold)", limits.hint)
        if isinstance(item, dict):
            if len(item) > limits.max_keys:
                raise ConfigError(f"{shown}: a mapping with {len(item)} keys (a {limits.kind} "
                                  f"may have {limits.max_keys})", limits.hint)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def json_object(data: Any, shown: str, what: str, hint: str) -> dict[str, Any]:
    """`data` if it is a JSON object, else the one-line error every reader gives for `[]`."""
    if not isinstance(data, dict):
        raise ConfigError(f"{shown}: expected {what} (a JSON object), got {json_type(data)}",
                          hint)
    return data


def json_type(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null", int: "a number", float: "a number"}.get(type(value), "a value")


# ---- YAML --------------------------------------------------------------------------------------

def compose_yaml(text: str, kind: str, shown: str) -> tuple[yaml.Node | None, _Replay]:
    """Check the event stream against the limits, then compose the node tree (bounded now).

    Anchors and aliases are refused outright in every kind of file we read: profiles have
    `extends` for reuse, and an alias is how a 1 KiB file expands to gigabytes.
    The checked events are replayed into the composer, so the text is parsed once.
    The caller must `dispose()` the returned loader after constructing the document.
    """
    limits = _limits(kind)
    events = _check_events(text, limits, shown)
    loader = _Replay(events)
    try:
        return loader.get_single_node(), loader
    except yaml.MarkedYAMLError as exc:  # e.g. two documents in one file
        raise yaml_error(exc, shown) from None


class _Replay(yaml.composer.Composer, yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
    """PyYAML's SafeLoader minus its reader/scanner/parser: composes from checked events."""

    def __init__(self, events: list[yaml.Event]) -> None:
        self._events, self._next = events, 0
        yaml.composer.Composer.__init__(self)
        yaml.constructor.SafeConstructor.__init__(self)
        yaml.resolver.Resolver.__init__(self)

    def check_event(self, *choices: type) -> bool:
        if self._next >= len(self._events):
            return False
        return not choices or isinstance(self._events[self._next], choices)

    def peek_event(self) -> yaml.Event:
        return self._events[self._next]

    def get_event(self) -> yaml.Event:
        self._next += 1
        return self._events[self._next - 1]

    def dispose(self) -> None:
        self._events = []


def _check_events(text: str, limits: Limits, shown: str) -> list[yaml.Event]:
    depth = nodes = 0
    keys: list[int] = []  # per open collection: items seen (mappings count keys+values)
    kept: list[yaml.Event] = []
    for event in _events(text, shown):
        kept.append(event)
        if isinstance(event, yaml.AliasEvent):
            raise _at(event, shown, "YAML aliases (`*name`) are not allowed",
                      "write the value out, or share settings with `extends`")
        if isinstance(event, yaml.NodeEvent) and event.anchor is not None:
            raise _at(event, shown, f"YAML anchors (`&{_clip(event.anchor, 20)}`) are not allowed",
                      "write the value out, or share settings with `extends`")
        if isinstance(event, (yaml.ScalarEvent, yaml.CollectionStartEvent)):
            nodes += 1
            if nodes > limits.max_nodes:
                raise _at(event, shown, f"more than {limits.max_nodes} values (the most a "
                                        f"{limits.kind} may hold)", limits.hint)
            if keys:
                keys[-1] += 1
                if keys[-1] > 2 * limits.max_keys:
                    raise _at(event, shown, f"more than {limits.max_keys} entries in one "
                                            f"mapping or list", limits.hint)
        if isinstance(event, yaml.ScalarEvent):
            _check_scalar(event, shown)
        elif isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            keys.append(0)
            if depth > limits.max_depth:
                raise _at(event, shown, f"nested deeper than {limits.max_depth} levels (the "
                                        f"most a {limits.kind} may have)", limits.hint)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
            keys.pop()
    return kept


def _events(text: str, shown: str) -> Iterator[yaml.Event]:
    loader = None
    try:
        loader = yaml.SafeLoader(text)  # checks every character is printable, here
        while loader.check_event():
            yield loader.get_event()
    except yaml.MarkedYAMLError as exc:
        raise yaml_error(exc, shown) from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow (control chars)
        line, col = _line_col(text, exc.position)
        raise ConfigError(f"{shown}:{line}:{col}: character {_char(exc.character)} is not "
                          "allowed in YAML", "remove the control character") from None
    finally:
        if loader is not None:
            loader.dispose()


def _char(character: object) -> str:
    code = ord(character) if isinstance(character, str) else character  # PyYAML gives the code
    return f"{code:#x}" if isinstance(code, int) else repr(code)


def _check_scalar(event: yaml.ScalarEvent, shown: str) -> None:
    value = event.value
    plain = event.style is None and event.implicit[0]
    if plain and len(value) > MAX_NUMBER_CHARS and _NUMBERISH.fullmatch(value):
        raise _at(event, shown, f"a number with {len(value)} characters",
                  "no setting takes a number that large")


def yaml_error(exc: yaml.MarkedYAMLError, shown: str) -> ConfigError:
    mark = exc.problem_mark or exc.context_mark
    where = f"{shown}:{mark.line + 1}:{mark.column + 1}" if mark else shown
    problem = exc.problem or exc.context or "invalid YAML"
    return ConfigError(f"{where}: YAML syntax error: {problem}", "fix the YAML syntax")


def construct(loader: _Replay, node: yaml.Node, shown: str) -> Any:
    """Build Python data from a checked node; constructor surprises become positioned errors."""
    try:
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        raise yaml_error(exc, shown) from None
    except (ValueError, OverflowError, TypeError) as exc:  # e.g. a timestamp out of range
        raise ConfigError(f"{shown}: cannot read a value: {_clip(str(exc))}",
                          "quote the value to keep it a string") from None


def parse_yaml_value(text: str, kind: str, shown: str) -> Any:
    """One bounded YAML document from a string (a `--set` value); positions are in the value."""
    node, loader = compose_yaml(decode(text.encode("utf-8", "surrogatepass"), shown), kind,
                                shown)
    try:
        return None if node is None else construct(loader, node, shown)
    finally:
        loader.dispose()


def _at(event: yaml.Event, shown: str, message: str, hint: str) -> ConfigError:
    mark = event.start_mark
    return ConfigError(f"{shown}:{mark.line + 1}:{mark.column + 1}: {message}", hint)


def _clip(text: str, width: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
