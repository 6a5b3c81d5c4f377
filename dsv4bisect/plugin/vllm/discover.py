"""Which switches a vLLM release reads on DeepSeek-V4's path: env variables from `envs.py` and
the config / CLI settings of `vllm/config/`, found by AST in its wheel, never imported
(docs/vllm.md, "Switches", states the rule). The result has the schema of SGLang's catalog
(`patching/switch_catalog.py`) and ships as `switch_data/vllm-<release>.json`.

An env switch (`VLLM_…`) is on the path when it is read
  1. in a module on DeepSeek-V4's NVIDIA path (`V4_PATH`: the model package's nvidia/ and
     common/ parts, 0.20.0's model files, the mHC kernels, the hash / sqrt-softplus routing,
     the sparse-attention indexer and DSA kernels, FlashMLA's ops, the NVFP4 / MXFP4 MoE
     oracles, the TRT-LLM NVFP4 experts, DeepGEMM's wrapper and MegaMoE; ROCm, XPU, CPU and
     DeepSeek-V4.1 parts excluded), or
  2. it is one of `GLOBAL_NUMERICS`: read elsewhere, but it changes which numerics path V4
     takes (breakable CUDA graphs, the fused MQA top-k, batch invariance).
Reads are `envs.VLLM_X`, `os.environ[...]`, `os.environ.get`, `os.getenv` with a literal.
Type and default come from `envs.py`'s `if TYPE_CHECKING:` declarations. `read` is the earliest
mode over the sites: `import` (module or class body), `construction` (`__init__`-like, weight
processing, quant-method dispatch, a cached function), `call` (anything else).

A config setting is on the path when it is one of `CONFIG_FIELDS` (the attention and indexer
backends and cache dtypes, the MoE / linear / sparse top-k kernel backends, the KV cache dtype
and block size, prefix caching, CUDA-graph mode and capture sizes, eager mode, the parallel
layout, the batch budget, speculative decoding) and the release has it. It is named as on the
command line: `--kv-cache-dtype` where the field has an option of its own, else
`--attention-config.indexer_kv_dtype` (the JSON option and the key, as vLLM's parser takes
dotted keys). Read at `construction` (the engine reads its config while it builds the model).

`hot` is always false: vLLM has no switch protocol here (every vLLM trial is a fresh launch).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from dsv4bisect.patching.switch_catalog import READS, Switch, SwitchCatalog, tier_of
from dsv4bisect.plugin.vllm.tree import Types, VllmTree, dataclass_fields, module_of

V4_PATH = re.compile(
    r"deepseek_v4|dsv4|/mhc|sparse_attn_indexer|fused_topk_bias|mla/indexer\.py|sparse_swa|"
    r"attention/ops/flashmla\.py|attention/dsa/|trtllm_nvfp4_moe|oracle/(nv|mx)fp4\.py|"
    r"deep_gemm_mega_moe|utils/deep_gemm\.py")
NOT_V4 = re.compile(r"deepseek_v41|/amd/|/xpu/|/cpu/|rocm|_test\.py$|/tests?/")
ENV_NAME = re.compile(r"^VLLM_[A-Z0-9_]+$")
GLOBAL_NUMERICS = ("VLLM_USE_BREAKABLE_CUDAGRAPH", "VLLM_USE_FUSED_MQA_TOPK",
                   "VLLM_BATCH_INVARIANT")
CONSTRUCTION = frozenset({"__init__", "__post_init__", "__new__", "create_weights",
                          "load_weights", "process_weights_after_loading", "get_quant_method",
                          "from_config", "maybe_update_config", "_init_fused_moe_experts",
                          "_init_mega_moe_experts"})
CACHED = re.compile(r"(^|\.)(cache|lru_cache|cached_property|cached)$")
# Config class -> the fields on DeepSeek-V4's numerics path (those the release has are listed).
CONFIG_FIELDS: dict[str, tuple[str, ...]] = {
    "AttentionConfig": ("backend", "mla_prefill_backend", "use_fp4_indexer_cache",
                        "indexer_kv_dtype", "indexer_sparse_logits", "indexer_decode_cp",
                        "use_prefill_query_quantization", "disable_flashinfer_q_quantization",
                        "use_trtllm_attention", "sparse_mla_force_mqa"),
    "KernelConfig": ("moe_backend", "linear_backend", "sparse_indexer_topk_backend",
                     "enable_flashinfer_autotune"),
    "CacheConfig": ("cache_dtype", "block_size", "enable_prefix_caching",
                    "calculate_kv_scales"),
    "CompilationConfig": ("mode", "cudagraph_mode", "cudagraph_capture_sizes",
                          "max_cudagraph_capture_size"),
    "ModelConfig": ("dtype", "quantization", "enforce_eager"),
    "ParallelConfig": ("tensor_parallel_size", "data_parallel_size",
                       "pipeline_parallel_size", "enable_expert_parallel", "all2all_backend",
                       "decode_context_parallel_size", "enable_eplb", "enable_dbo"),
    "SchedulerConfig": ("max_num_batched_tokens", "max_num_seqs", "enable_chunked_prefill",
                        "async_scheduling"),
    "SpeculativeConfig": ("method", "num_speculative_tokens"),
}
# A setting renamed between verified releases: the new name -> (old name, old value -> new).
RENAMES: dict[str, tuple[str, dict[str, str]]] = {
    "--attention-config.indexer_kv_dtype": (
        "--attention-config.use_fp4_indexer_cache", {"True": "mxfp4", "False": "auto"}),
}


# vLLM spells some settings with words SGLang's names do not use: a name `tier_of` leaves as
# `other` (or `scheduling`) takes these (the shared word lists stay as SGLang's catalogs use them).
_VLLM_TOPOLOGY = frozenset({"PARALLEL", "EXPERT", "ALL2ALL", "EPLB", "DBO", "SPEC", "CONTEXT"})
_VLLM_SCHEDULING = frozenset({"CACHING", "CUDAGRAPH", "EAGER", "CAPTURE", "PREFILL", "SEQS",
                              "BLOCK", "SCHEDULING", "MODE"})


def vllm_tier(name: str) -> str:
    """`tier_of`, then vLLM's own topology and scheduling words for what it left `other`."""
    tier = tier_of(name)
    words = set(re.split(r"[_\-.]+", name.strip("-").upper()))
    if tier in ("other", "scheduling") and words & _VLLM_TOPOLOGY:
        return "topology"
    if tier == "other" and words & _VLLM_SCHEDULING:
        return "scheduling"
    return tier


@dataclass(frozen=True)
class EnvDecl:
    type: str
    default: Any
    where: str


def env_declarations(tree: VllmTree) -> dict[str, EnvDecl]:
    """`if TYPE_CHECKING: VLLM_X: int = 0` in vllm/envs.py: type and default per name."""
    mod = tree.tree("vllm.envs")
    out: dict[str, EnvDecl] = {}
    if mod is None:
        return out
    for node in mod.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    default: Any
                    try:
                        default = ast.literal_eval(stmt.value) if stmt.value else None
                    except (ValueError, SyntaxError):
                        default = f"<{ast.unparse(stmt.value)}>" if stmt.value else None
                    out[stmt.target.id] = EnvDecl(_type_text(stmt.annotation), default,
                                                  f"vllm/envs.py:{stmt.lineno}")
    return out


def _type_text(node: ast.expr) -> str:
    text = ast.unparse(node).replace("Optional[", "").rstrip("]")
    text = re.sub(r"Literal\[.*\]", "str", text)
    return text.replace(" | None", "|None").replace(" ", "")


@dataclass(frozen=True)
class Read:
    name: str
    mode: str  # import | construction | call
    gates: str
    where: str


class _Scan(ast.NodeVisitor):
    """The env reads of one module, with the function they happen in."""

    def __init__(self, rel: str) -> None:
        self.rel, self.stack, self.reads = rel, [], []  # type: ignore[var-annotated]
        self.cached: list[bool] = []

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.stack.append(node.name)
        self.cached.append(any(CACHED.search(ast.unparse(d)) for d in node.decorator_list))
        self.generic_visit(node)
        self.stack.pop()
        self.cached.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.stack.append(node.name)
        self.cached.append(False)
        self.generic_visit(node)
        self.stack.pop()
        self.cached.pop()

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.value, ast.Name) and node.value.id == "envs" \
                and ENV_NAME.match(node.attr):
            self._read(node.attr, node.lineno)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = ast.unparse(node.func)
        if f in ("os.getenv", "os.environ.get", "environ.get", "getenv") and node.args \
                and isinstance(node.args[0], ast.Constant) \
                and ENV_NAME.match(str(node.args[0].value)):
            self._read(str(node.args[0].value), node.lineno)
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if ast.unparse(node.value) in ("os.environ", "environ") \
                and isinstance(node.slice, ast.Constant) and ENV_NAME.match(str(node.slice.value)):
            self._read(str(node.slice.value), node.lineno)
        self.generic_visit(node)

    def _read(self, name: str, line: int) -> None:
        funcs = [n for n in self.stack]
        if not funcs:
            mode, gates = "import", module_of(self.rel).rsplit(".", 1)[-1]
        else:
            gates = ".".join(funcs)
            inside = [n for n in funcs if n[:1].islower() or n.startswith("_")]
            if not inside:  # a class body
                mode = "import"
            elif any(n in CONSTRUCTION for n in funcs) or any(self.cached):
                mode = "construction"
            else:
                mode = "call"
        self.reads.append(Read(name, mode, gates, f"{self.rel}:{line}"))


def env_reads(tree: VllmTree) -> dict[str, list[Read]]:
    """name -> its reads in the V4-path modules, in file order."""
    out: dict[str, list[Read]] = defaultdict(list)
    for rel in tree.py_files():
        if not V4_PATH.search(rel) or NOT_V4.search(rel):
            continue
        text = tree.text(rel) or ""
        if "VLLM_" not in text:
            continue
        scan = _Scan(rel)
        scan.visit(ast.parse(text))
        for r in scan.reads:
            out[r.name].append(r)
    return out


def _global_reads(tree: VllmTree, names: tuple[str, ...]) -> dict[str, list[Read]]:
    """The first read of each global numerics switch anywhere in vllm/ (outside envs.py)."""
    out: dict[str, list[Read]] = {}
    for rel in tree.py_files():
        if rel == "vllm/envs.py" or NOT_V4.search(rel):
            continue
        text = tree.text(rel) or ""
        wanted = [n for n in names if n in text and n not in out]
        if not wanted:
            continue
        scan = _Scan(rel)
        scan.visit(ast.parse(text))
        for r in scan.reads:
            if r.name in wanted and r.name not in out:
                out[r.name] = [r]
        if len(out) == len(names):
            break
    return out


def _env_switch(name: str, reads: list[Read], decl: EnvDecl | None) -> Switch:
    mode = min((r.mode for r in reads), key=READS.index)
    first = reads[0]
    more = len({r.gates for r in reads}) - 1
    return Switch.model_validate({
        "name": name, "kind": "env", "type": decl.type if decl else "str",
        "default": decl.default if decl else None, "read": mode, "hot": False,
        "gates": first.gates + (f" (+{more})" if more else ""), "where": first.where,
        "tier": vllm_tier(name)})


def _flag_of(cls: str, field: str, cli: dict[str, Any]) -> str | None:
    """The option that sets `cls.field` on its own, or `--json-option.field`."""
    for flag, row in cli.items():
        if row.get("source") == f"{cls}.{field}":
            return flag
    for flag, row in cli.items():
        if row.get("value") == "json" and row.get("config") == cls:
            return f"{flag}.{field}"
    return None


def _type_name(desc: dict[str, Any]) -> str:
    kinds = [k for k in desc["kinds"] if k not in ("none", "enum")]
    text = "|".join(kinds) or "any"
    return text + ("|None" if "none" in desc["kinds"] else "")


def field_doc(cls: ast.ClassDef, name: str) -> str:
    """The docstring vLLM writes under a config field (the string literal after it)."""
    body = cls.body
    for i, stmt in enumerate(body[:-1]):
        if isinstance(stmt, ast.AnnAssign) and getattr(stmt.target, "id", None) == name:
            nxt = body[i + 1]
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) \
                    and isinstance(nxt.value.value, str):
                return nxt.value.value
    return ""


def _replaces(flag: str, present: dict[str, str]) -> tuple[str, ...]:
    """The declared old name of `flag` where this release has dropped it, or keeps it only as
    a deprecated alias (its field's docstring says so); `present`: flag -> field doc."""
    old = RENAMES.get(flag)
    if old is None or flag not in present:
        return ()
    doc = present.get(old[0])
    return (old[0],) if doc is None or doc.lstrip().lower().startswith("deprecated alias") \
        else ()


def config_settings(tree: VllmTree, cli: dict[str, Any]) -> list[Switch]:
    types = Types(tree)
    rows: list[tuple[str, str, str, dict[str, Any], str, str]] = []
    for cls_name, wanted in CONFIG_FIELDS.items():
        found = types.class_def(cls_name, "vllm.config")
        if found is None:
            continue
        where, cls = found
        fields = dataclass_fields(types, where, cls)
        rel = tree.module_file(where) or where
        for name in wanted:
            row = fields.get(name)
            flag = _flag_of(cls_name, name, cli) if row is not None else None
            if row is None or flag is None:
                continue
            rows.append((flag, cls_name, name, row, rel, field_doc(cls, name)))
    present = {flag: doc for flag, _, _, _, _, doc in rows}
    out: list[Switch] = []
    for flag, cls_name, name, row, rel, _ in rows:
        default = row.get("default")
        out.append(Switch.model_validate({
            "name": flag, "kind": "arg", "type": _type_name(row["type"]),
            "default": None if isinstance(default, str) and default.startswith("<") else default,
            "read": "construction", "hot": False, "gates": f"{cls_name}.{name}",
            "where": f"{rel}:{row['line']}", "tier": vllm_tier(flag),
            "replaces": _replaces(flag, present)}))
    return out


def discover(tree: VllmTree, release: str | None = None) -> SwitchCatalog:
    """The catalog of the release in `tree` (env switches first, then settings; by name)."""
    from dsv4bisect.plugin.vllm.facts import CliFacts

    decls = env_declarations(tree)
    reads = env_reads(tree)
    reads.update({k: v for k, v in _global_reads(
        tree, tuple(n for n in GLOBAL_NUMERICS if n in decls and n not in reads)).items()})
    envs = [_env_switch(n, reads[n], decls.get(n)) for n in sorted(reads) if n in decls]
    cli = CliFacts(tree, Types(tree)).run()["options"]
    settings = sorted(config_settings(tree, cli), key=lambda s: s.name)
    return SwitchCatalog(release=release or tree.version() or "unknown",
                         switches=(*envs, *settings), engine="vllm")


def renamed(catalog: SwitchCatalog, older: SwitchCatalog) -> dict[str, tuple[str, str]]:
    """New setting -> (old name, its old default translated) for the declared renames that
    happened between two catalogs (the old name gone, or kept as a deprecated alias)."""
    out: dict[str, tuple[str, str]] = {}
    for new, (old, values) in RENAMES.items():
        before = older.get(old)
        if catalog.get(new) is None or before is None:
            continue
        out[new] = (old, values.get(str(before.default_for(None)), str(before.default)))
    return out
