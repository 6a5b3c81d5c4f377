"""SGLang's tensor dumper as one release's source has it: what `localise` relies on to launch an
engine with it, drive it and read its dumps — read by AST from the release (a wheel or an
installed tree: `plugin/static.py`'s `SourceTree`), never imported (its imports need a GPU
stack). Torch-free.

`read_contract` returns what the source says; `problems` compares it with what `localise` uses
(`EXPECTED`) and names every difference, so a release that renamed an env var, a route, the file
naming or the saved format is refused before a launch instead of dumping nothing or something
unreadable (the maintainers' recipe: each of these settings fails silently when wrong).

The facts, from `sglang/srt/debug_utils/dumper.py` unless said:
- `DumperConfig` fields read from env vars `DUMPER_<FIELD>` (`_env_prefix`): `enable`, `dir`,
  `exp_name`, `server_port`, `non_intrusive_mode`, `filter`, `enable_output_console`;
- `server_port == "reuse"` (`server_port_parsed`) means no server of its own: the engine's
  HTTP server mounts `POST /dumper/{method}` (`entrypoints/http_server.py`, only when
  `DUMPER_SERVER_PORT` is `reuse`), methods `configure`, `reset`, `get_state`;
- one file per dumped tensor, `<dir>/<exp_name>/<k=v joined by "___">.pt`, the keys `step`,
  `rank`, `dump_index` first, then the tags (`name`, and the context: `layer_id`);
- the file holds `{"value": tensor, "meta": {...}}`;
- non-intrusive mode hooks every module and names a dump `non_intrusive__<module>.<sub>`,
  sub `inputs.<i>` or `output`; `all` dumps every module, `core` only the batch's ids,
  positions and lengths; the layer id comes from `layers.<N>` module names;
- `model_executor/model_runner.py` registers it on the model and steps it per forward when
  `dumper.may_enable`;
- `dump_loader.py`'s `parse_meta_from_filename` splits the name on `___` and `=`;
- the comparator: `python -m sglang.srt.debug_utils.comparator --baseline-path A
  --target-path B` (`comparator/entrypoint.py`);
- CUDA graphs off (hooks do not run inside a graph replay): `--disable-cuda-graph`, which from
  0.5.16 on is deprecated for `--cuda-graph-backend-{decode,prefill}=disabled` and turns both
  off; before, prefill's piecewise graphs need `--disable-piecewise-cuda-graph` too.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from dsv4bisect.plugin.static import SourceTree

DUMPER = "sglang.srt.debug_utils.dumper"
LOADER = "sglang.srt.debug_utils.dump_loader"
COMPARATOR = "sglang.srt.debug_utils.comparator"


@dataclass(frozen=True)
class DumperContract:
    release: str | None
    env_prefix: str | None
    fields: tuple[str, ...]
    reuse_value: str | None  # DUMPER_SERVER_PORT's value that mounts the routes on the engine
    route: str | None  # the engine's route (http_server.py)
    route_needs_reuse: bool
    methods: tuple[str, ...]
    tag_separator: str | None
    tag_format: str | None  # "k=v"
    filename_keys: tuple[str, ...]  # the keys before the tags
    suffix: str | None
    saved_keys: tuple[str, ...]  # keys of the saved dict
    name_prefix: str | None  # non-intrusive dumps
    sub_names: tuple[str, ...]  # "inputs.{i}", "output"
    layer_pattern: str | None
    modes: tuple[str, ...]  # non_intrusive_mode values the source tests
    runner_registers: bool
    runner_steps: bool
    loader_separators: tuple[str, ...]
    comparator_flags: tuple[str, ...]
    graphs_off: tuple[str, ...]  # the flags that turn CUDA graphs off in this release
    notes: tuple[str, ...] = field(default_factory=tuple)


EXPECTED = {
    "env_prefix": "DUMPER_",
    "fields": ("enable", "dir", "exp_name", "server_port", "non_intrusive_mode", "filter",
               "enable_output_console"),
    "reuse_value": "reuse", "route": "/dumper/{method}", "route_needs_reuse": True,
    "methods": ("configure", "reset", "get_state"), "tag_separator": "___",
    "tag_format": "k=v", "filename_keys": ("step", "rank", "dump_index"), "suffix": ".pt",
    "saved_keys": ("value", "meta"), "name_prefix": "non_intrusive__",
    "sub_names": ("inputs.{i}", "output"), "modes": ("all",), "runner_registers": True,
    "runner_steps": True, "loader_separators": ("___", "="),
    "comparator_flags": ("--baseline-path", "--target-path"),
}


def _class(tree: ast.Module | None, name: str) -> ast.ClassDef | None:
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


def _func(scope: ast.AST | None, name: str) -> ast.FunctionDef | None:
    for node in ast.walk(scope) if scope is not None else ():
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def _strings(scope: ast.AST | None) -> list[str]:
    return [n.value for n in ast.walk(scope) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)] if scope is not None else []


def _returned_string(fn: ast.FunctionDef | None) -> str | None:
    for node in ast.walk(fn) if fn is not None else ():
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Constant):
            return str(node.value.value)
    return None


def _tag_format(fn: ast.FunctionDef | None) -> tuple[str | None, str | None]:
    """`_format_tags`: `SEP.join(f"{k}={v}" for k, v in ...)` -> (SEP, "k=v")."""
    for node in ast.walk(fn) if fn is not None else ():
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "join" and \
                isinstance(node.func.value, ast.Constant):
            sep = node.func.value.value
            gen = node.args[0] if node.args else None
            elt = getattr(gen, "elt", None)
            if isinstance(elt, ast.JoinedStr):
                parts = ["{}" if isinstance(v, ast.FormattedValue) else v.value
                         for v in elt.values]
                return sep, "k=v" if parts == ["{}", "=", "{}"] else "".join(parts)
            return sep, None
    return None, None


def _dump_single(fn: ast.FunctionDef | None) -> tuple[tuple[str, ...], str | None,
                                                       tuple[str, ...]]:
    """(keys of `full_kwargs = dict(step=..., rank=..., dump_index=..., **tags)`, the file
    suffix added to `_format_tags(...)`, the keys of the saved dict)."""
    keys: tuple[str, ...] = ()
    suffix = None
    saved: tuple[str, ...] = ()
    for node in ast.walk(fn) if fn is not None else ():
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                getattr(node.value.func, "id", None) == "dict" and \
                any(getattr(t, "id", None) == "full_kwargs" for t in node.targets):
            keys = tuple(k.arg for k in node.value.keywords if k.arg)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and \
                isinstance(node.left, ast.Call) and \
                getattr(node.left.func, "id", None) == "_format_tags" and \
                isinstance(node.right, ast.Constant):
            suffix = node.right.value
        if isinstance(node, ast.Dict) and node.keys and all(
                isinstance(k, ast.Constant) for k in node.keys):
            names = tuple(k.value for k in node.keys)
            if "value" in names:
                saved = names
    return keys, suffix, saved


def _class_constant(cls: ast.ClassDef | None, name: str) -> str | None:
    for node in cls.body if cls is not None else ():
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name
                                                 for t in node.targets):
            value = node.value
            if isinstance(value, ast.Constant):
                return str(value.value)
            if isinstance(value, ast.Call) and value.args and \
                    isinstance(value.args[0], ast.Constant):  # re.compile(r"...")
                return str(value.args[0].value)
    return None


def _graphs_off(src: SourceTree) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The flags that turn CUDA graphs off for decode and prefill, from server_args.py."""
    text = src.text("sglang/srt/server_args.py") or ""
    tree = ast.parse(text) if text else None
    flags: dict[str, ast.Call] = {}
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument" \
                and node.args and isinstance(node.args[0], ast.Constant):
            flags[str(node.args[0].value)] = node
    notes = []
    main = flags.get("--disable-cuda-graph")
    if main is None:
        return (), ("no --disable-cuda-graph in server_args.py",)
    new_flag = next((k.value.value for k in main.keywords if k.arg == "new_flag"
                     and isinstance(k.value, ast.Constant)), "")
    if "prefill" in str(new_flag):
        notes.append(f"--disable-cuda-graph stands for {new_flag}")
        return ("--disable-cuda-graph",), tuple(notes)
    if "--disable-piecewise-cuda-graph" in flags:
        return ("--disable-cuda-graph", "--disable-piecewise-cuda-graph"), tuple(notes)
    return ("--disable-cuda-graph",), ("no flag for prefill graphs found",)


def read_contract(src: SourceTree) -> DumperContract:
    dumper = src.tree(DUMPER)
    config = _class(dumper, "DumperConfig")
    fields = tuple(n.target.id for n in (config.body if config else ())
                   if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name))
    prefix = _returned_string(_func(config, "_env_prefix"))
    parsed = _func(config, "server_port_parsed")
    reuse = next((s for s in _strings(parsed) if s == "reuse"), None)
    sep, fmt = _tag_format(_func(dumper, "_format_tags"))
    keys, suffix, saved = _dump_single(_func(dumper, "_dump_single"))
    hook = _class(dumper, "_NonIntrusiveDumper")
    subs = []
    for s in _strings(hook):
        if s == "output":
            subs.append("output")
    for node in ast.walk(hook) if hook is not None else ():
        if isinstance(node, ast.JoinedStr) and [
                v.value for v in node.values if isinstance(v, ast.Constant)] == ["inputs."]:
            subs.append("inputs.{i}")
    modes = tuple(sorted({s for s in _strings(hook) if s in ("all", "core", "off")} |
                         {s for s in _strings(_func(dumper, "register_non_intrusive_dumper"))
                          if s in ("all", "core", "off")}))
    manager = _func(dumper, "_handle_request_inner")
    methods = tuple(s for s in ("configure", "reset", "get_state") if s in _strings(manager))
    http = src.text("sglang/srt/entrypoints/http_server.py") or ""
    route = "/dumper/{method}" if '"/dumper/{method}"' in http else None
    needs_reuse = 'os.environ.get("DUMPER_SERVER_PORT") == "reuse"' in http
    runner = src.text("sglang/srt/model_executor/model_runner.py") or ""
    loader = _func(src.tree(LOADER), "parse_meta_from_filename")
    loader_strings = _strings(loader)
    entry = src.text("sglang/srt/debug_utils/comparator/entrypoint.py") or ""
    graphs, notes = _graphs_off(src)
    return DumperContract(
        release=src.version(), env_prefix=prefix, fields=fields, reuse_value=reuse,
        route=route, route_needs_reuse=needs_reuse, methods=methods, tag_separator=sep,
        tag_format=fmt, filename_keys=keys, suffix=suffix, saved_keys=saved,
        name_prefix=_class_constant(hook, "_NAME_PREFIX"), sub_names=tuple(dict.fromkeys(subs)),
        layer_pattern=_class_constant(hook, "_LAYER_NAME_RE"), modes=modes,
        runner_registers="dumper.register_non_intrusive_dumper(self.model)" in runner,
        runner_steps="dumper.step()" in runner,
        loader_separators=tuple(s for s in ("___", "=") if s in loader_strings),
        comparator_flags=tuple(f for f in ("--baseline-path", "--target-path")
                               if f'"{f}"' in entry),
        graphs_off=graphs, notes=notes)


def problems(c: DumperContract) -> list[str]:
    """Every way `c` differs from what `localise`'s SGLang path uses (empty: usable)."""
    out = []
    for key, want in EXPECTED.items():
        got = getattr(c, key)
        if isinstance(want, tuple) and key in ("fields", "methods", "modes", "sub_names",
                                               "comparator_flags", "loader_separators"):
            missing = [w for w in want if w not in got]
            if missing:
                out.append(f"{key}: {missing} missing (source has {list(got)})")
        elif key == "filename_keys":
            if tuple(got[:len(want)]) != want:
                out.append(f"{key}: the file name starts {list(got)}, expected {list(want)}")
        elif key == "saved_keys":
            if not set(want) <= set(got):
                out.append(f"{key}: the saved dict has {list(got)}, expected {list(want)}")
        elif got != want:
            out.append(f"{key}: {got!r}, expected {want!r}")
    if not c.layer_pattern or "layers" not in c.layer_pattern:
        out.append(f"layer_pattern: {c.layer_pattern!r} does not read `layers.N`")
    if not c.graphs_off:
        out.append("graphs_off: no flag turns CUDA graphs off")
    return out


def launch_env(dump_dir: str, contract: DumperContract) -> dict[str, str]:
    """The dumper's env as the release reads it: off at boot (warm-up dumps nothing), every
    module in non-intrusive mode, its routes on the engine's own port, the dump directory."""
    p = contract.env_prefix or "DUMPER_"
    return {f"{p}ENABLE": "0", f"{p}NON_INTRUSIVE_MODE": "all",
            f"{p}SERVER_PORT": contract.reuse_value or "reuse", f"{p}DIR": dump_dir,
            f"{p}ENABLE_OUTPUT_CONSOLE": "0"}


def comparator_command(baseline: str, target: str) -> list[str]:
    """SGLang's own comparator over the two dumps: the cross-check `localise` prints."""
    return ["python", "-m", COMPARATOR, "--baseline-path", baseline, "--target-path", target]
