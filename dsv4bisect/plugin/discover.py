"""Which switches an SGLang release reads on DeepSeek-V4's path: found by AST in its wheel or
source tree, never imported (docs/sglang.md, "Switch discovery" states the rule).

An env switch is on the path when it is read
  1. in a module whose path is DeepSeek-V4-specific (`V4_MODULE`: the model files, mHC, hash
     top-k, the dsv4 compressor / indexer / attention backends, their kernels and quantisation
     paths; tests, multimodal and tool-call parsing excluded), or
  2. in a shared configuration module (`model_config.py`, `server_args.py`, `arg_groups/`)
     inside a block that only DeepSeek-V4 reaches (an `if` whose test, or a function whose
     name, names it), where reads and per-architecture `envs.X.set(...)` are both taken.
A server argument is on the path when its name selects a kernel, a number format or the
parallel topology (`ARG_RULE`). Names an env read must carry: `SGLANG_` / `SGL_`.

Per switch: its declaration in `srt/environ.py` (type, default) or the reader call's default,
the per-architecture defaults the V4 blocks set, every read site, the earliest reading mode
(import: module or class body; construction: `__init__`-like or cached, or a helper one of
those calls; call: anything else, or an import-time copy read only per call), `hot` (env,
every model-path site a call-time read, AND one the plugin's switch file delivers: a built-in
patch's per-call env rule, which the hot switch flips by setting `os.environ` and re-assigning
the copies, plugin/hot.py `deliverable_env`) and what it gates (the function reading it).
Imports no torch.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

from dsv4bisect.patching.switch_catalog import READS, Switch, SwitchCatalog, arg_name, tier_of
from dsv4bisect.plugin.hot import deliverable_env
from dsv4bisect.plugin.static import SourceTree

V4_MARK = re.compile(r"deepseek_?v4|dsv4", re.IGNORECASE)
V4_MODULE = re.compile(r"deepseek_?v4|dsv4|mhc|hash_topk|flash_mla_sm120", re.IGNORECASE)
NOT_V4 = re.compile(r"^sglang/(test|multimodal|srt/multimodal|srt/function_call)/|_vit\.py$")
SHARED = re.compile(r"^sglang/srt/(configs/model_config\.py|server_args\.py|arg_groups/)")
ENV_NAME = re.compile(r"^SGLA?NG_[A-Z0-9_]+$")
ARG_FILES = re.compile(r"^sglang/srt/(server_args\.py|arg_groups/fields/[a-z_]+\.py)$")
# Server arguments that select a kernel, a number format or the parallel topology.
ARG_RULE = re.compile(
    r"^((prefill_|decode_)?attention_backend|moe_runner_backend|moe_a2a_backend|"
    r"[a-z0-9]*_gemm_(runner_)?backend|kv_cache_dtype|quantization|dtype|"
    r"(tp|dp|ep|pp|moe_dp|attn_cp|cp)_size|enable_dp_attention|enable_dp_lm_head|"
    r"chunked_prefill_size|(disable_)?(decode_|prefill_)?cuda_graph.*|deepep_mode|"
    r"speculative_(algorithm|num_steps|eagle_topk|num_draft_tokens|attention_mode|"
    r"draft_attention_backend|draft_kv_cache_dtype|draft_model_quantization|"
    r"moe_runner_backend|moe_a2a_backend)|"
    r"enable_two_batch_overlap|enable_torch_compile|page_size|ep_num_redundant_experts|"
    r"(nsa|dsa)_(prefill|decode)_backend)$")
NOT_ARG = re.compile(r"^(mm_|lora|hicache|vision|encoder|debug_|enable_profile_)|_config$")
WRITES = frozenset({"set", "override", "clear", "unset"})
READERS = {"getenv": "str", "get": "str", "get_bool_env_var": "bool",
           "get_int_env_var": "int", "get_float_env_var": "float", "get_str_env_var": "str"}
CONSTRUCTION = frozenset({"__init__", "__post_init__", "__new__", "create_weights",
                          "load_weights", "process_weights_after_loading", "get_quant_method",
                          "from_config", "setup"})
CACHED = re.compile(r"(^|\.)(cache|lru_cache|cached_property|cached)$")
ARCHS = (("sm120", re.compile(r"sm120|sm_120")), ("sm100", re.compile(r"sm100|blackwell")),
         ("sm90", re.compile(r"sm90|hopper")), ("hip", re.compile(r"is_hip|rocm|aiter\b")),
         ("npu", re.compile(r"is_npu")))
_NEGATED = re.compile(r"\bnot\s+[\w.]+(\(\))?(\.\w+(\(\))?)*")  # `not get_platform().is_hip`
ENV_TYPES = {"EnvBool": "bool", "EnvInt": "int", "EnvFloat": "float", "EnvStr": "str",
             "EnvTuple": "tuple", "EnvJSON": "json"}


@dataclass(frozen=True)
class EnvDecl:
    """`NAME = EnvBool(default)` in srt/environ.py: its type, default and line."""

    type: str
    default: object
    where: str


# Platform tests in SGLang's source (`_is_hip = is_hip()`, `get_platform().is_npu()`,
# `_is_gfx95_supported`, `_use_aiter`): a read that only happens, or only matters, where one of
# the other vendors' tests is true is behind it (`_behind_other_vendor`).
OTHER_VENDOR_TEST = re.compile(r"^_?(is_hip|is_npu|use_aiter|is_gfx\w*)$")
CUDA_TEST = re.compile(r"^_?is_cuda$")
BEHIND = ("vendor", "")  # a stack entry: the read below sits behind another vendor's test


def _test_name(node: ast.expr) -> str:
    """`_is_hip`, `is_hip()`, `get_platform().is_hip()` -> their last name (else "")."""
    if isinstance(node, ast.Call) and not node.args:
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _behind_other_vendor(op: ast.BoolOp, index: int) -> bool:
    """Whether operand `index` of `op` is read, or matters, only off NVIDIA: an `and` with
    another vendor's test (`_is_hip and envs.X.get()`, `envs.X.get() and _is_hip`: False on
    CUDA whatever X is), or an `or` after the CUDA test (`_is_cuda or envs.X.get()`: not
    evaluated on CUDA)."""
    names = [_test_name(v) for v in op.values]
    if isinstance(op.op, ast.And):
        return any(OTHER_VENDOR_TEST.match(n) for i, n in enumerate(names) if i != index)
    return any(CUDA_TEST.match(n) for n in names[:index])


def _branch_behind_other_vendor(test: ast.expr) -> tuple[bool, bool]:
    """(body, orelse) of `if test:` that run only off NVIDIA."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(OTHER_VENDOR_TEST.match(_test_name(v)) for v in test.values), False
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return False, bool(OTHER_VENDOR_TEST.match(_test_name(test.operand)))
    name = _test_name(test)
    return bool(OTHER_VENDOR_TEST.match(name)), bool(CUDA_TEST.match(name))


@dataclass(frozen=True)
class Site:
    name: str
    where: str
    gates: str  # Class.method / function / <module>
    mode: str  # import | construction | call
    guarded: bool  # inside a block only DeepSeek-V4 reaches (its name/test says so)
    resolution: bool  # in a shared configuration module: read once, while the server starts
    type: str | None = None  # the reader call's type (no environ declaration)
    default: object = None
    copy: str | None = None  # `module.global` the value is copied into at import, read per call
    other_vendor: bool = False  # behind an AMD/NPU platform test (`_behind_other_vendor`)


@dataclass
class Writes:
    """Per-architecture `envs.X.set(V)` in V4 blocks: arch -> value, and the forced archs;
    per-architecture server-argument values (`self.x = V`, `server_args.x = V`,
    `overrides["x"] = V`, `declare_resolution(..., x=V)`) in them: field -> arch -> value."""

    by_arch: dict[str, dict[str, object]] = field(default_factory=lambda: defaultdict(dict))
    forced: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    args: dict[str, dict[str, object]] = field(default_factory=lambda: defaultdict(dict))


def discover(src: SourceTree, release: str | None = None,
             deliverable: frozenset[str] | None = None) -> SwitchCatalog:
    """The catalog of `src` (a wheel or a tree holding `sglang/`). `deliverable`: the env
    switches the plugin's switch file can flip (default: `deliverable_env(release)`); only
    those can be `hot`."""
    release = release or src.version() or "unknown"
    if deliverable is None:
        deliverable = deliverable_env(release)
    decls = env_declarations(src)
    sites: dict[str, list[Site]] = defaultdict(list)
    writes = Writes()
    scans = []
    for rel in src.py_files():
        v4_file = bool(V4_MODULE.search(rel)) and not NOT_V4.search(rel)
        if not v4_file and not SHARED.match(rel):
            continue
        tree = _parse(src, rel)
        if tree is not None:
            scans.append(_ModuleScan(rel, tree, writes, v4_file, bool(SHARED.match(rel))))
    # a V4 module's helper is often called from another one's __init__ (0.5.19's fused-mHC
    # guard): a bare call counts in every module read, a method call in its own module
    modes = function_modes(scans)
    for scan in scans:
        for site in scan.sites(modes):
            if scan.v4_file or site.guarded:
                sites[site.name].append(site)
    _readers_elsewhere(src, {n for n in writes.by_arch if n not in sites and n in decls},
                       sites)
    envs = [_env_switch(n, s, decls.get(n), writes, n in deliverable)
            for n, s in sorted(sites.items())]
    return SwitchCatalog(release=release, switches=(*sorted(envs, key=lambda s: s.name),
                                                    *server_args(src, writes.args)))


def _readers_elsewhere(src: SourceTree, names: set[str], sites: dict[str, list[Site]]) -> None:
    """Where the switches the V4 blocks set, but no V4 module reads, are read: any module of
    the release outside its tests (a text search first, then AST)."""
    if not names:
        return
    for rel in src.py_files():
        if rel.startswith("sglang/test/"):
            continue
        text = src.text(rel) or ""
        if not any(n in text for n in names):
            continue
        tree = _parse(src, rel)
        if tree is None:
            continue
        scan = _ModuleScan(rel, tree, Writes(), False, bool(SHARED.match(rel)))
        for site in scan.sites(function_modes([scan])):
            if site.name in names:
                sites[site.name].append(site)


def _parse(src: SourceTree, rel: str) -> ast.Module | None:
    text = src.text(rel)
    if text is None:
        return None
    try:
        return src.parse(rel, text)
    except SyntaxError:
        return None  # a file the release ships broken is not read on any path


def env_declarations(src: SourceTree) -> dict[str, EnvDecl]:
    """`NAME = EnvBool(default)`-style declarations in `sglang/srt/environ.py`."""
    rel = "sglang/srt/environ.py"
    tree = _parse(src, rel)
    out: dict[str, EnvDecl] = {}
    for cls in [n for n in (tree.body if tree else []) if isinstance(n, ast.ClassDef)]:
        for stmt in cls.body:
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                    and isinstance(stmt.targets[0], ast.Name)
                    and isinstance(stmt.value, ast.Call)
                    and isinstance(stmt.value.func, ast.Name)
                    and stmt.value.func.id.startswith("Env")):
                continue
            kind = re.sub(r"WithAlias$", "", stmt.value.func.id)
            default = _default_of(stmt.value.args[0]) if stmt.value.args else None
            out[stmt.targets[0].id] = EnvDecl(ENV_TYPES.get(kind, kind), default,
                                              f"{rel}:{stmt.lineno}")
    return out


def _default_of(node: ast.expr) -> object:
    """A JSON value; a platform-computed default as {"default", "<arch>"}; else the code."""
    if isinstance(node, ast.Name) and node.id == "_default_hip":
        return {"default": False, "hip": True}
    try:
        return _jsonable(ast.literal_eval(node))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return f"<{ast.unparse(node)}>"


def _jsonable(value: object) -> object:
    if isinstance(value, (tuple, list, set, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


class _ModuleScan:
    """Every env read (and V4-block write) of one module, with its enclosing scope."""

    def __init__(self, rel: str, tree: ast.Module, writes: Writes, v4_file: bool,
                 resolution: bool) -> None:
        self.rel, self.tree, self.writes, self.v4_file = rel, tree, writes, v4_file
        self.resolution = resolution
        self.consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                       and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                       for t in n.targets if isinstance(t, ast.Name)}
        self.raw: list[tuple[str, int, tuple, str | None, object]] = []
        # (None: a bare `f()` anywhere | this module: `x.f()` here, callee) -> calling functions
        self.callers: dict[tuple[str | None, str], set[tuple[str, str] | None]] = \
            defaultdict(set)
        self.global_uses: dict[str, set[str | None]] = defaultdict(set)  # global -> readers
        self.module = rel[:-len(".py")].replace("/", ".").removesuffix(".__init__")
        self._visit(tree, ())

    def sites(self, modes: dict[tuple[str, str], str]) -> Iterator[Site]:
        for name, line, stack, typ, default in self.raw:
            funcs = [s for s in stack if s[0] == "def"]
            mode = "import" if not funcs else "construction" if self.resolution else \
                min((modes.get((self.rel, f[1]), "call") for f in funcs), key=READS.index)
            copy = None
            if stack and stack[0][0] == "global" and not self.resolution:
                # `_g = envs.X.get()` at import: what counts is when `_g` is read
                uses = self.global_uses.get(stack[0][1], set())
                if uses and None not in uses and all(modes.get((self.rel, u), "call") == "call"
                                                     for u in uses):
                    mode, copy = "call", f"{self.module}.{stack[0][1]}"
            guarded = any(V4_MARK.search(s[1]) for s in stack)
            yield Site(name, f"{self.rel}:{line}", _qualname(stack), mode, guarded,
                       self.resolution, typ, default, copy, BEHIND in stack)

    def _visit(self, node: ast.AST, stack: tuple) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self._visit(child, (*stack, ("def", child.name)))
            elif isinstance(child, ast.Lambda):  # runs when called, like a def
                self._visit(child, (*stack, ("def", "<lambda>")))
            elif isinstance(child, ast.ClassDef):
                self._visit(child, (*stack, ("class", child.name)))
            elif isinstance(child, ast.Assign) and not stack and \
                    isinstance(child.targets[0], ast.Name):
                self._see(child, stack)  # a module global copied at import: it is the gate
                self._visit(child, (("global", child.targets[0].id),))
            elif isinstance(child, ast.If):
                self._visit(ast.Expression(body=child.test), stack)  # the test as a child
                body, orelse = _branch_behind_other_vendor(child.test)
                inner = (*stack, ("if", ast.unparse(child.test)), *((BEHIND,) if body else ()))
                for stmt in child.body:
                    self._visit_stmt(stmt, inner)
                for stmt in child.orelse:
                    self._visit_stmt(stmt, (*stack, BEHIND) if orelse else stack)
            elif isinstance(child, ast.BoolOp):
                for i, value in enumerate(child.values):
                    inner = (*stack, BEHIND) if _behind_other_vendor(child, i) else stack
                    self._visit(ast.Expression(body=value), inner)  # a nested `or` as a child
            else:
                self._see(child, stack)
                self._visit(child, stack)

    def _visit_stmt(self, stmt: ast.stmt, stack: tuple) -> None:
        wrapper = ast.Module(body=[stmt], type_ignores=[])
        self._visit(wrapper, stack)

    def _see(self, node: ast.AST, stack: tuple) -> None:
        if isinstance(node, (ast.Assign, ast.Call)):
            self._see_arg_write(node, stack)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            funcs = [s for s in stack if s[0] == "def"]
            self.global_uses[node.id].add(funcs[-1][1] if funcs else None)
        if isinstance(node, ast.Call):
            key = (self.rel, node.func.attr) if isinstance(node.func, ast.Attribute) else \
                (None, node.func.id) if isinstance(node.func, ast.Name) else None
            if key:
                funcs = [s for s in stack if s[0] == "def"]
                self.callers[key].add((self.rel, funcs[-1][1]) if funcs else None)
            self._see_reader_call(node, stack)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
                and isinstance(node.value.value, ast.Name) and node.value.value.id == "envs" \
                and ENV_NAME.match(node.value.attr):
            if node.attr in WRITES:
                return  # a write: _see_reader_call took it as a call
            self.raw.append((node.value.attr, node.lineno, stack, None, None))
        if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ" \
                and isinstance(node.ctx, ast.Load):
            name = self._string(node.slice)
            if name:
                self.raw.append((name, node.lineno, stack, "str", None))

    def _see_reader_call(self, call: ast.Call, stack: tuple) -> None:
        func = ast.unparse(call.func)
        if func.startswith("envs.") and func.endswith(".set") and call.args:
            self._see_write(func.split(".")[1], call, stack)
            return
        short = func.rsplit(".", 1)[-1]
        if short not in READERS or not call.args or \
                (short == "get" and not func.endswith("environ.get")):
            return
        name = self._string(call.args[0])
        if name:
            default = _default_of(call.args[1]) if len(call.args) > 1 else \
                next((_default_of(k.value) for k in call.keywords if k.arg == "default"), None)
            self.raw.append((name, call.lineno, stack, READERS[short], default))

    def _archs(self, stack: tuple) -> list[str]:
        """The architectures the enclosing `if`s of a V4 block name (none outside one; a
        negated test such as `not is_hip` names none)."""
        if not (self.v4_file or any(V4_MARK.search(s[1]) for s in stack)):
            return []
        tests = [_NEGATED.sub("", s[1]) for s in stack if s[0] == "if"]
        return [a for a, rx in ARCHS if any(rx.search(t) for t in tests)]

    @staticmethod
    def _only_arch_conditions(stack: tuple, field_name: str) -> bool:
        """Every enclosing `if` is an architecture or device test, a DeepSeek-V4 test or the
        field's own unset check (`== "auto"`, `is None`): a value set under any other
        condition (the checkpoint's format, another argument) is no per-architecture
        default."""
        for kind, test, *_ in stack:
            if kind != "if":
                continue
            node = ast.parse(test, mode="eval").body
            parts = node.values if isinstance(node, ast.BoolOp) and \
                isinstance(node.op, ast.And) else [node]
            for part in parts:
                text = ast.unparse(part)
                if not (V4_MARK.search(text) or any(rx.search(text) for _, rx in ARCHS)
                        or re.search(r"\bdevice\b", text)
                        or (field_name in text and re.search(r"'auto'|is None", text))):
                    return False
        return True

    def _see_arg_write(self, node: ast.AST, stack: tuple) -> None:
        if not self.resolution:
            return  # only the server-args resolution sets arguments
        pairs: list[tuple[str, ast.expr]] = []
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            t = node.targets[0]
            if isinstance(t, ast.Attribute) and ast.unparse(t.value) in ("self", "server_args"):
                pairs.append((t.attr, node.value))
            elif isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant) \
                    and isinstance(t.slice.value, str):
                pairs.append((t.slice.value, node.value))
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("declare_resolution"):
            pairs += [(k.arg, k.value) for k in node.keywords if k.arg]
        archs = self._archs(stack) if pairs else []
        for name, value in pairs:
            if not ARG_RULE.match(name) or not isinstance(value, ast.Constant) or \
                    not self._only_arch_conditions(stack, name):
                continue
            for arch in archs:
                self.writes.args[name][arch] = value.value

    def _see_write(self, name: str, call: ast.Call, stack: tuple) -> None:
        archs = self._archs(stack)
        tests = [s[1] for s in stack if s[0] == "if"]
        guarded = any(t.replace(" ", "") == f"notenvs.{name}.is_set()" for t in tests)
        for arch in archs:
            self.writes.by_arch[name][arch] = _default_of(call.args[0])
            if not guarded:
                self.writes.forced[name].add(arch)

    def _string(self, node: ast.expr) -> str | None:
        value = node.value if isinstance(node, ast.Constant) else \
            self.consts.get(node.id) if isinstance(node, ast.Name) else None
        return value if isinstance(value, str) and ENV_NAME.match(value) else None


def function_modes(scans: list[_ModuleScan]) -> dict[tuple[str, str], str]:
    """(module file, function name) -> the earliest mode it runs in: construction when
    `__init__`-like or cached; import when a module body calls it, construction when such a
    function does (a helper that decides at load and is asked again per call still fixed the
    value at load); call otherwise (never called from `scans`: a forward is called from
    outside). Callers: a bare `f()` in any module read, `x.f()` in the defining module."""
    modes: dict[tuple[str, str], str] = {}
    defined: list[tuple[str, str]] = []
    callers: dict[tuple[str | None, str], set[tuple[str, str] | None]] = defaultdict(set)
    for scan in scans:
        for node in ast.walk(scan.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defined.append((scan.rel, node.name))
                cached = any(CACHED.search(ast.unparse(d).split("(")[0])
                             for d in node.decorator_list)
                if node.name in CONSTRUCTION or cached:
                    modes[scan.rel, node.name] = "construction"
        for key, by in scan.callers.items():
            callers[key] |= by
    changed = True
    while changed:
        changed = False
        for rel, name in defined:
            by = callers.get((None, name), set()) | callers.get((rel, name), set())
            earliest = min(("import" if c is None else modes.get(c, "call") for c in by),
                           key=READS.index, default="call")
            if READS.index(earliest) < READS.index(modes.get((rel, name), "call")):
                modes[rel, name] = earliest
                changed = True
    return modes


def _qualname(stack: tuple) -> str:
    names = [s[1] for s in stack if s[0] in ("def", "class", "global")]
    return ".".join(names) or "<module>"


def _env_switch(name: str, sites: list[Site], decl: EnvDecl | None, writes: Writes,
                deliverable: bool) -> Switch:
    """The model-path sites decide the mode and whether it could be `hot`; a read in the
    server-args resolution only picks the launch value (it sets os.environ), so it neither
    makes nor breaks `hot`. `deliverable`: the switch file can carry it (else never hot)."""
    sites = sorted(sites, key=lambda s: (s.resolution, READS.index(s.mode), s.where))
    first = sites[0]
    model = [s for s in sites if not s.resolution]
    typ = decl.type if decl else next((s.type for s in sites if s.type), "str")
    default = decl.default if decl else next((s.default for s in sites if s.default), None)
    gates = first.gates + (f" (+{len(sites) - 1})" if len(sites) > 1 else "")
    return Switch(name=name, kind="env", type=typ, default=_per_arch(default, name, writes),
                  read=first.mode, hot=deliverable and bool(model) and all(s.mode == "call" for s in model),
                  gates=gates,
                  where=first.where, tier=tier_of(name),
                  forced=tuple(sorted(writes.forced.get(name, ()))),
                  copies=tuple(sorted({s.copy for s in model if s.copy})),
                  also=tuple(dict.fromkeys(s.where for s in sites[1:] if s.where != first.where)),
                  other_vendor=tuple(dict.fromkeys(s.where for s in sites if s.other_vendor)))


def _per_arch(default: object, name: str, writes: Writes) -> object:
    return _with_arch(default, writes.by_arch.get(name))


def _with_arch(default: object, by_arch: dict[str, object] | None) -> object:
    if not by_arch:
        return default
    base = dict(default) if isinstance(default, dict) and "default" in default else \
        {"default": default}
    return {**base, **by_arch}


def server_args(src: SourceTree, per_arch: dict[str, dict[str, object]]) -> list[Switch]:
    """The kernel / format / topology server arguments (`ARG_RULE`) as the release declares
    them: dataclass fields of `ServerArgs` (and of `arg_groups/fields/` where it has them),
    with the values the V4 blocks give them per architecture (`per_arch`)."""
    out: dict[str, Switch] = {}
    for rel in [r for r in src.py_files() if ARG_FILES.match(r)]:
        tree = _parse(src, rel)
        for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)] if tree else []:
            for stmt in cls.body:
                if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                    continue
                field_name = stmt.target.id
                if not ARG_RULE.match(field_name) or NOT_ARG.match(field_name):
                    continue
                name = arg_name(field_name)
                out.setdefault(name, Switch(
                    name=name, kind="arg", type=_arg_type(stmt.annotation),
                    default=_with_arch(_arg_default(stmt.value), per_arch.get(field_name)),
                    read="construction", hot=False,
                    gates=f"{cls.name}.{field_name}", where=f"{rel}:{stmt.lineno}",
                    tier=tier_of(field_name)))
    return sorted(out.values(), key=lambda s: s.name)


def _arg_type(node: ast.expr) -> str:
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "A":
        inner = node.slice.elts[0] if isinstance(node.slice, ast.Tuple) else node.slice
        return _arg_type(inner)
    text = ast.unparse(node)
    m = re.fullmatch(r"Optional\[(.+)\]", text)
    return f"{m.group(1)}|None" if m else text.replace(" ", "")


def _arg_default(node: ast.expr | None) -> object:
    if node is None:
        return None
    if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("field"):
        for kw in node.keywords:
            if kw.arg == "default":
                return _default_of(kw.value)
            if kw.arg == "default_factory":
                return f"<{ast.unparse(kw.value)}()>"
    return _default_of(node)
