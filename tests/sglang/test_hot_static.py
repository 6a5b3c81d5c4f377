"""What hot switching relies on, read statically from every verified release's wheel (13):
where `flush_cache` is and that it acts only on a fully idle scheduler, that POST /flush_cache
reaches it on every TP rank, the decode-graph re-capture entry SGLang itself uses, that
DeepSeek-V4 runs no prefill graph by default, that `envs.X.get()` reads os.environ at every
call, that each upstream switch's `read_once` matches where the release reads it, and that a
switch copied into a module global at import (`SglangRule.copies`) is read from that global at
every call and from nowhere else at load."""

from __future__ import annotations

import ast

import pytest

from dsv4bisect.base.versions import parse_version
from dsv4bisect.patching.registry import builtin_patches
from dsv4bisect.plugin.graphs import PREFILL_RUNNERS, recapture_entry
from dsv4bisect.plugin.hot import SWITCH_SIGNATURES
from dsv4bisect.plugin.static import SourceTree

SCHED = "sglang.srt.managers.scheduler"
RUNNER = "sglang.srt.model_executor.model_runner"
# Where DeepSeek-V4's upstream switches are read (as test_static_targets.py).
SWITCH_MODULES = (
    "sglang.srt.models.deepseek_v4", "sglang.srt.layers.attention.dsv4.indexer",
    "sglang.srt.layers.moe.hash_topk", "sglang.srt.layers.attention.flash_mla_sm120",
    "sglang.kernels.ops.attention.flash_mla_sm120",
    "sglang.srt.models.deepseek_common.amd.deepseek_v4_fused_mhc")


@pytest.fixture(scope="module")
def tree(wheel):
    return SourceTree(wheel)


def _class(mod: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in mod.body if isinstance(n, ast.ClassDef) and n.name == name)


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)


def _self_call(node: ast.AST, name: str) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == name and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "self")


def test_switch_targets_have_the_signatures_the_plugin_checks(tree):
    for target, sig in SWITCH_SIGNATURES.items():
        found = tree.resolve(target)
        assert not isinstance(found, str), found
        assert sig.mismatch(found.param_names) is None, target


def test_flush_cache_only_flushes_a_fully_idle_scheduler(tree):
    flush = _method(_class(tree.tree(SCHED), "Scheduler"), "flush_cache")
    first = flush.body[1] if isinstance(flush.body[0], ast.Expr) else flush.body[0]  # docstring
    assert isinstance(first, ast.If) and _self_call(first.test, "is_fully_idle")
    inside = [n for stmt in first.body for n in ast.walk(stmt)]
    assert any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and n.func.attr == "reset" and ast.unparse(n.func.value) == "self.tree_cache"
               for n in inside), "the prefix cache is reset inside the idle branch"
    assert any(isinstance(n, ast.Assign) and ast.unparse(n.value) == "False"
               for stmt in first.orelse for n in ast.walk(stmt)), "not idle: success False"


def test_post_flush_cache_reaches_the_instance_method_on_every_tp_rank(tree):
    sched = _class(tree.tree(SCHED), "Scheduler")
    src = ast.unparse(sched)
    assert "(FlushCacheReqInput, self.flush_wrapper.handle)" in src
    # bound when the Scheduler is built, i.e. after the plugin hooked the class attribute
    assert any(isinstance(n, ast.Call) and ast.unparse(n.func) == "SchedulerFlushWrapper"
               and any(k.arg == "flush_cache" and ast.unparse(k.value) == "self.flush_cache"
                       for k in n.keywords) for n in ast.walk(sched))
    wrapper = tree.source("sglang.srt.managers.scheduler_components.flush_wrapper") or ""
    assert "success=self._flush_cache()" in wrapper
    # rank 0 receives and broadcasts the control requests to the other TP ranks
    mod = tree.tree("sglang.srt.managers.scheduler_components.request_receiver")
    bcast = next(n for n in ast.walk(mod) if isinstance(n, ast.FunctionDef)
                 and n.name == "_broadcast_reqs_across_ranks")
    assert any(isinstance(n, ast.Call) and ast.unparse(n.func) == "broadcast_pyobj"
               for n in ast.walk(bcast))


def test_the_recapture_entry_is_the_one_sglang_uses_after_updating_weights(tree):
    version = tree.version() or ""
    method, attr = recapture_entry(version) or ("?", "?")
    runner = _class(tree.tree(RUNNER), "ModelRunner")
    entry = _method(runner, method)
    assert [a.arg for a in entry.args.args] == ["self"] and not entry.args.vararg
    body = list(ast.walk(entry))
    assigns = any(isinstance(n, ast.Attribute) and n.attr == attr
                  and isinstance(n.ctx, ast.Store) for n in body)
    assert assigns or any(_self_call(n, "init_decode_cuda_graph") for n in body)
    handed = any(isinstance(n, ast.keyword) and n.arg == "recapture_cuda_graph"
                 and ast.unparse(n.value) == f"self.{method}" for n in ast.walk(runner))
    update = _method(runner, "update_weights_from_disk") if not handed else None
    assert handed or any(_self_call(n, method) for n in ast.walk(update)), \
        f"SGLang {version} does not re-capture through ModelRunner.{method}"


def test_deepseek_v4_captures_no_prefill_graph_by_default(tree):
    mod = tree.tree("sglang.srt.configs.model_config")
    deny = next(n for n in mod.body if isinstance(n, ast.Assign) and ast.unparse(
        n.targets[0]) == "piecewise_cuda_graph_disabled_model_archs")
    assert "DeepseekV4ForCausalLM" in ast.literal_eval(deny.value)
    runner = ast.unparse(_class(tree.tree(RUNNER), "ModelRunner"))
    assert any(f"self.{a} = " in runner for a in PREFILL_RUNNERS)  # what the switch checks


def test_env_fields_read_os_environ_at_every_call(tree):
    field = _class(tree.tree("sglang.srt.environ"), "EnvField")
    get = _method(field, "get")
    assert not get.decorator_list  # no cache in front of the read
    assert any(isinstance(n, ast.Call) and ast.unparse(n) == "os.getenv(self.name)"
               for n in ast.walk(get))


def _copy_assign(mod: ast.Module, name: str, var: str) -> list[ast.Assign]:
    """Module-level `name = envs.VAR.get()` statements."""
    return [n for n in mod.body if isinstance(n, ast.Assign) and len(n.targets) == 1
            and ast.unparse(n.targets[0]) == name and ast.unparse(n.value) == f"envs.{var}.get()"]


def _reads(tree: SourceTree, var: str, copies: tuple = ()) -> tuple[bool, bool]:
    """(read at load, read per call) of `envs.VAR.get()` in the DeepSeek-V4 switch modules.
    At load: at module level, in an `__init__`, or in a helper reached from one of those. The
    module-level assignments of the rule's import-time `copies` are not counted (the plugin
    assigns them again; test_import_copies_are_read_per_call_only checks their readers)."""
    mods = [m for m in (tree.tree(name) for name in SWITCH_MODULES) if m is not None]
    funcs: dict[str, ast.FunctionDef] = {}
    for mod in mods:
        for n in ast.walk(mod):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                funcs.setdefault(n.name, n)  # type: ignore[arg-type]

    def called(nodes: list[ast.AST]) -> set[str]:
        return {n.func.id for node in nodes for n in ast.walk(node)
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}

    roots: list[ast.AST] = [s for mod in mods for s in mod.body
                            if not isinstance(s, (ast.FunctionDef, ast.ClassDef))]
    roots += [f for f in funcs.values() if f.name == "__init__"]
    roots += [n for mod in mods for n in ast.walk(mod)
              if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
    at_load, todo = set(), called(roots)
    while todo:
        name = todo.pop()
        if name in funcs and name not in at_load:
            at_load.add(name)
            todo |= called([funcs[name]])

    exempt = {id(a.value) for c in copies if (m := tree.tree(c.module)) is not None
               for a in _copy_assign(m, c.name, c.var)}
    load = per_call = False
    for mod in mods:
        stack: list[tuple[ast.AST, str | None]] = [(mod, None)]
        while stack:
            node, fn = stack.pop()
            if (isinstance(node, ast.Call) and ast.unparse(node) == f"envs.{var}.get()"
                    and id(node) not in exempt):
                if fn is None or fn == "__init__" or fn in at_load:
                    load = True
                else:
                    per_call = True
            inner = node.name if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                else fn
            stack += [(c, inner) for c in ast.iter_child_nodes(node)]
    return load, per_call


def test_read_once_matches_where_the_release_reads_each_switch(tree):
    """`read_once` set ⇔ the release reads the switch at import or while building the model;
    unset ⇔ it reads it only inside functions that run at call time (then the plugin can flip
    it in a running engine)."""
    version = parse_version(tree.version() or "")
    checked = 0
    for patch in builtin_patches().values():
        for rule in patch.sglang.rules:
            if rule.how != "env" or not rule.covers(version, None):
                continue
            for var in rule.variables:
                load, per_call = _reads(tree, var, rule.copies)
                assert load or per_call or rule.copies, f"{patch.name}: nothing reads {var}"
                assert bool(rule.read_once) == load, (
                    f"{patch.name} {rule.archs}: {var} read "
                    f"{'at load' if load else 'per call only'}, rule says read_once="
                    f"{rule.read_once!r:.60}")
                checked += 1
    assert checked >= 3


def _functions_reading(mod: ast.Module, name: str) -> list[str]:
    """Functions of `mod` in which the global `name` is loaded."""
    return sorted({f.name for f in ast.walk(mod) if isinstance(f, ast.FunctionDef)
                   for n in ast.walk(f) if isinstance(n, ast.Name) and n.id == name
                   and isinstance(n.ctx, ast.Load)})


def test_import_copies_are_read_per_call_only(tree):
    """Each `SglangRule.copies` entry of a rule covering this release: the module assigns the
    global exactly once, at module level, from `envs.VAR.get()`; no function assigns it (no
    `global`); it is read inside functions that do not run at import; and no other file of the
    release names it (nothing took a copy of the copy, e.g. `from m import name`)."""
    version = parse_version(tree.version() or "")
    checked = []
    for patch in builtin_patches().values():
        for rule in patch.sglang.rules:
            if not rule.covers(version, None):
                continue
            for c in rule.copies:
                mod = tree.tree(c.module)
                assert mod is not None, f"{c.module} is not in SGLang {version}"
                assert len(_copy_assign(mod, c.name, c.var)) == 1, c.target
                stores = [n for n in ast.walk(mod) if isinstance(n, ast.Name) and n.id == c.name
                          and isinstance(n.ctx, ast.Store)]
                assert len(stores) == 1, f"{c.target} is assigned again"
                assert not any(isinstance(n, ast.Global) and c.name in n.names
                               for n in ast.walk(mod)), f"{c.target} is rebound in a function"
                readers = _functions_reading(mod, c.name)
                assert readers, f"nothing reads {c.target} at call time"
                at_import = {n.func.id for s in mod.body if not isinstance(
                    s, (ast.FunctionDef, ast.ClassDef)) for n in ast.walk(s)
                    if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
                assert not at_import & set(readers), f"{c.target} is read at import"
                own = tree.module_file(c.module)
                others = [rel for rel in tree.py_files()
                          if rel.startswith(("sglang/srt/", "sglang/kernels/")) and rel != own
                          and c.name in (tree.text(rel) or "")]
                assert not others, f"{c.name} is named outside {c.module}: {others}"
                checked.append((c.target, readers))
    if version >= (0, 5, 15):  # sm120-flashmla-backend: the decode entry point dispatches on it
        assert any(t.endswith("._sm120_default_backend")
                   and "flash_mla_with_kvcache_sm120" in readers for t, readers in checked)
    else:
        assert not checked


def test_sm120_backend_is_compared_at_every_call_of_the_decode_entry(tree):
    """`flash_mla_with_kvcache_sm120` compares `_sm120_default_backend` with "flashinfer" and
    "triton" in its body, and imports those backends there (nothing backend-specific at
    import); DeepSeek-V4's attention backend calls it from its forward."""
    version = parse_version(tree.version() or "")
    if version < (0, 5, 15):
        pytest.skip("SGLANG_SM120_FLASHMLA_BACKEND first appears in 0.5.15")
    from dsv4bisect.base.versions import check_version
    from dsv4bisect.sglang_hooks.targets import mla_module

    layout = check_version(tree.version() or "", allow_unverified=True).layout or ""
    mod = tree.tree(mla_module(layout))
    entry = next(n for n in mod.body if isinstance(n, ast.FunctionDef)
                 and n.name == "flash_mla_with_kvcache_sm120")
    compared = {ast.literal_eval(n.comparators[0]) for n in ast.walk(entry)
                if isinstance(n, ast.Compare) and ast.unparse(n.left) == "_sm120_default_backend"}
    assert compared == {"flashinfer", "triton"}
    imports = {(n.module or "") for n in ast.walk(mod) if isinstance(n, ast.ImportFrom)}
    top = {(n.module or "") for n in mod.body if isinstance(n, ast.ImportFrom)}
    assert any("flashinfer" in m for m in imports - top)  # imported at its first call
    assert not any("flashinfer" in m or "flash_mla_sm120_triton" in m for m in top)
    backend = tree.tree("sglang.srt.layers.attention.deepseek_v4_backend")
    callers = [f.name for f in ast.walk(backend) if isinstance(f, ast.FunctionDef)
               and any(isinstance(n, ast.Call) and ast.unparse(n.func) ==
                       "flash_mla_with_kvcache_sm120" for n in ast.walk(f))]
    assert callers and "__init__" not in callers
