"""The facts of one vLLM release that dsv4bisect relies on, extracted from its source by AST.

vLLM does not import on a machine without its CUDA stack, and its wheels are hundreds of MB,
so the plugin's targets, `vllm serve`'s arguments and the OpenAI request models are read from
the wheel once (`python tests/benchmarks/gen_vllm_facts.py`) and ship as
`dsv4bisect/base/vllm_data/vllm-<release>.json`. The slow tests regenerate them from the wheels
and require equality; the fast tests check the plugin's tables, the shipped profiles' argv and
the probe's requests against them. Sections:

- `symbols`: every target any layout declares (`declared.all_targets()`), on every release:
  kind, parameter names, file:line, or null when the release lacks it;
- `by_value`: for each hooked module-level function, the modules that import it by value
  (`from M import f [as g]`): module -> local name;
- `calls`: the call sites the hooks rely on (`declared.call_contracts`): keywords, positional
  count, per layout;
- `cli`: `vllm serve`'s options: flags, dest, what value they take (as vLLM's `get_kwargs`
  derives it from the config dataclass field), choices, the config class of a JSON option;
- `configs`: the fields of every config class a JSON option takes (nested ones too);
- `requests`: the fields of the request and response models the probe sends and reads.

Imports no torch and no vLLM.
"""

from __future__ import annotations

import ast
from typing import Any

from dsv4bisect.base.vllm_releases import FACTS_SCHEMA, LAYOUTS, layout_of_range
from dsv4bisect.base.versions import parse_version
from dsv4bisect.plugin.static import Resolved, _find, call_keywords
from dsv4bisect.plugin.vllm import declared
from dsv4bisect.plugin.vllm.tree import (
    Types,
    VllmTree,
    absolute_import,
    dataclass_fields,
    default_text,
    module_of,
)

ARG_UTILS = "vllm.engine.arg_utils"
CLI_MODULES = ("vllm.entrypoints.openai.cli_args", "vllm.entrypoints.common.cli_args")
REQUEST_MODELS = {
    "CompletionRequest": "vllm.entrypoints.openai.completion.protocol",
    "ChatCompletionRequest": "vllm.entrypoints.openai.chat_completion.protocol",
    "TokenizeChatRequest": "vllm.entrypoints.serve.tokenize.protocol",
    "TokenizeCompletionRequest": "vllm.entrypoints.serve.tokenize.protocol",
    "CompletionResponse": "vllm.entrypoints.openai.completion.protocol",
    "CompletionResponseChoice": "vllm.entrypoints.openai.completion.protocol",
    "ChatCompletionResponse": "vllm.entrypoints.openai.chat_completion.protocol",
    "ErrorResponse": ("vllm.entrypoints.openai.engine.protocol",
                      "vllm.entrypoints.serve.engine.protocol"),
    "ErrorInfo": ("vllm.entrypoints.openai.engine.protocol",
                  "vllm.entrypoints.serve.engine.protocol"),
    "ModelCard": ("vllm.entrypoints.openai.engine.protocol",
                  "vllm.entrypoints.serve.engine.protocol"),
    "UsageInfo": ("vllm.entrypoints.openai.engine.protocol",
                  "vllm.entrypoints.serve.engine.protocol"),
    "PromptTokenUsageInfo": ("vllm.entrypoints.openai.engine.protocol",
                             "vllm.entrypoints.serve.engine.protocol"),
}


class FactsError(RuntimeError):
    """The source does not have the shape the extraction expects (a layout changed)."""


# -- symbols, by-value copies, call sites ------------------------------------------------------
def symbol_facts(tree: VllmTree, names: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for target in names:
        found = tree.resolve(target)
        if isinstance(found, Resolved):
            out[target] = {"kind": found.kind, "params": list(found.param_names),
                           "where": f"{found.file}:{found.line}"}
        else:
            out[target] = None
    return out


def by_value_facts(tree: VllmTree, names: list[str]) -> dict[str, dict[str, str]]:
    """target -> {importing module: local name} for `from M import f` anywhere in vllm/."""
    wanted = {(t.rsplit(".", 1)[0], t.rsplit(".", 1)[1]): t for t in names}
    out: dict[str, dict[str, str]] = {t: {} for t in names}
    needles = {t.rsplit(".", 1)[1] for t in names}
    for rel in tree.py_files():
        text = tree.text(rel) or ""
        if not any(n in text for n in needles):
            continue
        module = module_of(rel)
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.ImportFrom):
                continue
            source = absolute_import(module, rel, node)
            for alias in node.names:
                target = wanted.get((source or "", alias.name))
                if target is not None and module != source:
                    out[target][module] = alias.asname or alias.name
    return {t: dict(sorted(v.items())) for t, v in out.items()}


def call_facts(tree: VllmTree) -> dict[str, Any]:
    """layout -> patch -> [{module, within, callee, calls: [{keywords, positional}]}]."""
    out: dict[str, Any] = {}
    for layout in LAYOUTS:
        rows: dict[str, Any] = {}
        for patch, contracts in declared.call_contracts(layout).items():
            rows[patch] = [{"module": c.module, "within": c.within, "callee": c.callee,
                            "calls": [{"keywords": sorted(call_keywords(call)),
                                       "positional": len(call.args)}
                                      for call in tree.calls(c.module, c.callee, c.within)]}
                           for c in contracts]
        out[layout] = rows
    return out


# -- `vllm serve`'s options ---------------------------------------------------------------------
def _value_of(desc: dict[str, Any], field: str) -> dict[str, Any]:
    """What an option takes, as `_compute_kwargs` (vllm/engine/arg_utils.py) derives it from a
    field's type hints (checked in that order there)."""
    kinds = set(desc["kinds"])
    if "config" in kinds:
        return {"value": "json", "config": desc.get("config")}
    if kinds >= {"bool", "str"} and kinds <= {"bool", "str", "none"}:
        return {"value": "bool-or-str"}
    if "bool" in kinds:
        return {"value": "bool"}
    if desc.get("choices") is not None:
        return {"value": "choice", "choices": desc["choices"], "none": "none" in kinds}
    if "list" in kinds:
        return {"value": "list"}
    if "int" in kinds:
        return {"value": "int"}
    if "float" in kinds:
        return {"value": "float"}
    if "dict" in kinds:
        return {"value": "json-or-str" if "str" in kinds or "any" in kinds else "json"}
    return {"value": "str"}


def _explicit_value(call: ast.Call) -> dict[str, Any] | None:
    """An option whose kwargs are written out (`type=int`, `action="store_true"`, ...)."""
    kw = {k.arg: k.value for k in call.keywords if k.arg is not None}
    action = kw.get("action")
    if action is not None:
        text = ast.unparse(action)
        if "store_true" in text or "store_false" in text:
            return {"value": "flag"}
        if "BooleanOptionalAction" in text:
            return {"value": "bool"}
        if "append" in text:
            return {"value": "str"}
    if "choices" in kw:
        try:
            return {"value": "choice", "choices": list(ast.literal_eval(kw["choices"])),
                    "none": False}
        except (ValueError, SyntaxError):
            return {"value": "str"}
    if kw.get("nargs") is not None and ast.unparse(kw["nargs"]) in ("'+'", "'*'"):
        return {"value": "list"}
    typ = ast.unparse(kw["type"]) if "type" in kw else None
    if typ in ("int",):
        return {"value": "int"}
    if typ in ("float",):
        return {"value": "float"}
    if typ is not None and "json" in typ:
        return {"value": "json-or-str"}
    if typ is not None or "default" in kw or "help" in kw:
        return {"value": "str"}
    return None


def _kwargs_source(call: ast.Call, classes: dict[str, str],
                   picked: dict[str, tuple[str, str]]) -> tuple[str, str] | None:
    """(config class, field) of `add_argument(..., **model_kwargs["field"])`, or of
    `**moe_backend_kwargs` after `moe_backend_kwargs = kernel_kwargs["moe_backend"]`."""
    for k in call.keywords:
        if k.arg is not None:
            continue
        for node in ast.walk(k.value):
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) \
                    and node.value.id in classes and isinstance(node.slice, ast.Constant):
                return classes[node.value.id], str(node.slice.value)
            if isinstance(node, ast.Name) and node.id in picked:
                return picked[node.id]
    return None


def _picked_fields(func: ast.AST, classes: dict[str, str]) -> dict[str, tuple[str, str]]:
    """`moe_backend_kwargs = kernel_kwargs["moe_backend"]` -> {name: (KernelConfig, field)}."""
    out: dict[str, tuple[str, str]] = {}
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Subscript) \
                and isinstance(node.value.value, ast.Name) and node.value.value.id in classes \
                and isinstance(node.value.slice, ast.Constant):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = (classes[node.value.value.id], str(node.value.slice.value))
    return out


def _get_kwargs_vars(func: ast.AST) -> dict[str, str]:
    """`model_kwargs = get_kwargs(ModelConfig)` -> {"model_kwargs": "ModelConfig"}."""
    out: dict[str, str] = {}
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                and getattr(node.value.func, "id", None) == "get_kwargs" and node.value.args:
            cls = node.value.args[0]
            for t in node.targets:
                if isinstance(t, ast.Name) and isinstance(cls, ast.Name):
                    out[t.id] = cls.id
    return out


def _flags(call: ast.Call) -> list[str]:
    return [a.value for a in call.args if isinstance(a, ast.Constant)
            and isinstance(a.value, str)]


class CliFacts:
    """`vllm serve`'s options, from EngineArgs/AsyncEngineArgs.add_cli_args, the frontend args
    dataclass and make_arg_parser."""

    def __init__(self, tree: VllmTree, types: Types) -> None:
        self.tree, self.types = tree, types
        self.options: dict[str, dict[str, Any]] = {}
        self.configs: dict[str, dict[str, Any]] = {}

    def run(self) -> dict[str, Any]:
        arg_tree = self.tree.tree(ARG_UTILS)
        if arg_tree is None:
            raise FactsError(f"no {ARG_UTILS}")
        for cls_name in ("EngineArgs", "AsyncEngineArgs"):
            cls = _find(arg_tree.body, cls_name)
            method = _find(cls.body, "add_cli_args") if isinstance(cls, ast.ClassDef) else None
            if method is None:
                if cls_name == "EngineArgs":
                    raise FactsError("EngineArgs.add_cli_args not found")
                continue
            self._calls(method, ARG_UTILS)
        self._frontend()
        for name in sorted({o["config"] for o in self.options.values() if o.get("config")}):
            self._config(name, ARG_UTILS)
        return {"options": dict(sorted(self.options.items())),
                "configs": dict(sorted(self.configs.items()))}

    def _calls(self, func: ast.AST, module: str) -> None:
        classes = _get_kwargs_vars(func)
        picked = _picked_fields(func, classes)
        for node in ast.walk(func):
            if not (isinstance(node, ast.Call) and getattr(node.func, "attr", None)
                    == "add_argument"):
                continue
            flags = _flags(node)
            if not flags or not flags[0].startswith("-"):
                continue
            source = _kwargs_source(node, classes, picked)
            if source is not None:
                cls_name, field = source
                row = self._field_option(cls_name, field, module)
            else:
                row = _explicit_value(node) or {"value": "str"}
            long = [f for f in flags if f.startswith("--")] or flags
            self.options[long[0]] = {"aliases": [f for f in flags if f != long[0]], **row}

    def _field_option(self, cls_name: str, field: str, module: str) -> dict[str, Any]:
        found = self.types.class_def(cls_name, module)
        if found is None:
            return {"value": "str", "source": f"{cls_name}.{field}"}
        fields = dataclass_fields(self.types, found[0], found[1])
        if field not in fields:
            return {"value": "str", "source": f"{cls_name}.{field}"}
        row = _value_of(fields[field]["type"], field)
        return {**row, "source": f"{cls_name}.{field}"}

    def _frontend(self) -> None:
        for module in CLI_MODULES:
            mtree = self.tree.tree(module)
            if mtree is None:
                continue
            cls = _find(mtree.body, "FrontendArgs")
            if not isinstance(cls, ast.ClassDef):
                continue
            if not self._loops_over_fields(mtree):
                raise FactsError(f"{module}: FrontendArgs no longer adds every field as an "
                                 "option (no `add_argument(f\"--{...}\")` loop)")
            for name, row in dataclass_fields(self.types, module, cls).items():
                flag = "--" + name.replace("_", "-")
                self.options.setdefault(flag, {"aliases": [], **_value_of(row["type"], name),
                                               "source": f"FrontendArgs.{name}"})
            parser = _find(mtree.body, "make_arg_parser")
            if parser is not None:
                self._calls(parser, module)
            return
        raise FactsError("no FrontendArgs in " + " or ".join(CLI_MODULES))

    @staticmethod
    def _loops_over_fields(mtree: ast.Module) -> bool:
        for node in ast.walk(mtree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument" \
                    and any(isinstance(a, ast.JoinedStr) for a in node.args):
                return True
        return False

    def _config(self, name: str, module: str, depth: int = 0) -> None:
        if name in self.configs or depth > 3:
            return
        found = self.types.class_def(name, module)
        if found is None:
            found_any = self.types.classes.get(name)
            if found_any is None:
                self.configs[name] = {"fields": None}
                return
            found = found_any
        where, cls = found
        fields = dataclass_fields(self.types, where, cls)
        self.configs[name] = {"where": f"{where}:{cls.lineno}",
                              "fields": {k: {"type": v["type"], **({"default": v["default"]}
                                                                    if "default" in v else {}),
                                             "line": v["line"]}
                                         for k, v in fields.items()}}
        for row in fields.values():
            nested = row["type"].get("config")
            if nested:
                self._config(nested, where, depth + 1)


# -- request models -----------------------------------------------------------------------------
def request_facts(tree: VllmTree, types: Types) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, modules in REQUEST_MODELS.items():
        for module in (modules,) if isinstance(modules, str) else modules:
            found = types.class_def(name, module)
            if found is None:
                continue
            fields = dataclass_fields(types, found[0], found[1])
            out[name] = {"where": f"{found[0]}:{found[1].lineno}",
                         "fields": {k: {"type": v["type"],
                                        **({"default": v["default"]} if "default" in v else {})}
                                    for k, v in fields.items()}}
            break
        else:
            out[name] = None
    return out


def extract(tree: VllmTree) -> dict[str, Any]:
    """Every fact of the release in `tree` (a wheel or a source directory)."""
    version = tree.version()
    if version is None:
        raise FactsError(f"{tree.root}: no version (not a built vLLM)")
    parsed = parse_version(version)
    types = Types(tree)
    cli = CliFacts(tree, types).run()
    return {
        "schema": FACTS_SCHEMA,
        "release": version,
        "layout": layout_of_range(parsed) if parsed else None,
        "symbols": symbol_facts(tree, declared.all_targets()),
        "by_value": by_value_facts(tree, declared.by_value_targets()),
        "calls": call_facts(tree),
        "cli": cli["options"],
        "configs": cli["configs"],
        "requests": request_facts(tree, types),
    }


def dumps(facts: dict[str, Any]) -> str:
    """The shipped file's text: sorted keys, one top-level entry of a section per line, so a
    regenerated file diffs by symbol / option / field."""
    import json

    lines = ["{"]
    keys = list(facts)
    for i, key in enumerate(keys):
        value = facts[key]
        end = "," if i < len(keys) - 1 else ""
        if isinstance(value, dict) and value:
            lines.append(f"{json.dumps(key)}: {{")
            items = list(value.items())
            for j, (k, v) in enumerate(items):
                sep = "," if j < len(items) - 1 else ""
                lines.append(f" {json.dumps(k)}: {json.dumps(v, sort_keys=True)}{sep}")
            lines.append("}" + end)
        else:
            lines.append(f"{json.dumps(key)}: {json.dumps(value, sort_keys=True)}{end}")
    lines.append("}")
    return "\n".join(lines) + "\n"


__all__ = ["FactsError", "extract", "dumps", "default_text"]
