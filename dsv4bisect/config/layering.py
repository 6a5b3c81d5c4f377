"""Finding profiles, following `extends`, merging layers and applying command-line overrides.

The result is raw data plus provenance: for every key path, the place that set it (a file
position, or the command-line flag). Validation (`validate.py`) turns positions into
`file:line:col:` errors; `profile show --why` prints the provenance.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from dsv4bisect.base import bounded
from dsv4bisect.config.yamlsource import KeyPath, Mark, load_yaml
from dsv4bisect.errors import ConfigError, did_you_mean

Source = Mark | str  # a file position, or a flag such as "--set engine.tp=4"


@dataclass
class Layered:
    """Merged profile data with provenance; mutable only while overrides are applied."""

    data: dict[str, Any]
    provenance: dict[KeyPath, Source]
    files: list[Path] = field(default_factory=list)  # the extends chain, base first
    origin: Path | None = None  # the file that was asked for

    def source_of(self, path: KeyPath) -> Source | None:
        """The source of `path`, or of its nearest ancestor that has one."""
        for cut in range(len(path), -1, -1):
            if path[:cut] in self.provenance:
                return self.provenance[path[:cut]]
        return None


def builtin_dir() -> Path:
    return Path(str(resources.files("dsv4bisect.profiles")))


def builtin_names() -> list[str]:
    return sorted(p.stem for p in builtin_dir().glob("*.yaml") if not p.stem.startswith("_"))


def find_profile(ref: str, *, relative_to: Path | None = None) -> Path:
    """A profile reference is a file path (relative to `relative_to`) or a built-in name."""
    if "\0" in ref or len(ref) > 4096:
        raise ConfigError(f"no profile `{ref[:80]!r}`: not a usable file name",
                          "give a path to a YAML file or a built-in profile name")
    candidates = []
    if relative_to is not None:
        candidates.append(relative_to / ref)
    candidates.append(Path(ref))
    for path in candidates:
        if is_file(path):
            return path.resolve()
    builtin = builtin_dir() / f"{ref}.yaml"
    if "/" not in ref and is_file(builtin):
        return builtin
    if not ref.endswith((".yaml", ".yml")):
        # `profile new mine` writes mine.yaml; `run mine` means that file (a built-in name
        # still means the built-in, so a stray file never changes a built-in experiment)
        for path in candidates:
            for suffix in (".yaml", ".yml"):
                if is_file(path.with_name(path.name + suffix)):
                    return path.with_name(path.name + suffix).resolve()
    here = _yaml_files_beside(candidates[-1])
    guess = did_you_mean(ref, [*builtin_names(), *here, *(Path(f).stem for f in here)])
    hint = f"{guess} " if guess else ""
    if here:
        hint += f"profile files: {', '.join(here[:8])}{' ...' if len(here) > 8 else ''}; "
    raise ConfigError(
        f"no profile `{ref}`: not a file and not a built-in profile",
        f"{hint}built-in profiles: {', '.join(builtin_names())}; or give a path to a YAML file",
    )


def _yaml_files_beside(path: Path) -> list[str]:
    """The profile files in the directory `path` names (what a user may have meant)."""
    folder = path.parent
    try:
        found = sorted(p.name for p in folder.iterdir() if p.suffix in (".yaml", ".yml"))
    except OSError:
        return []
    return [str(folder / name) if str(folder) != "." else name for name in found]


def is_file(path: Path) -> bool:
    """`Path.is_file` that answers False for names the OS refuses (too long, bad bytes)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def is_dir(path: Path) -> bool:
    """`Path.is_dir`, likewise (Python raises ENAMETOOLONG instead of answering False)."""
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False


def display_path(path: Path) -> str:
    """Built-in profiles show as `builtin:<name>.yaml`; files relative to the cwd when possible."""
    try:
        return f"builtin:{path.relative_to(builtin_dir())}"
    except ValueError:
        pass
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


MAX_KEY_PARTS = 8  # --set a.b.c: the schema is 5 levels deep
MAX_EXTENDS = 16  # profiles extending profiles: the shipped chains are 2 deep


def load_layers(path: Path, _chain: tuple[Path, ...] = ()) -> Layered:
    """Load `path` and its `extends` chain (cycles, missing bases, > MAX_EXTENDS are errors)."""
    doc = load_yaml(path, display=display_path(path))
    if not isinstance(doc.data, dict):
        raise ConfigError(
            f"{doc.marks[()]}: a profile must be a mapping of keys, got {type(doc.data).__name__}",
            "start from `dsv4bisect profile new NAME`",
        )
    own = Layered(data=doc.data, provenance=dict(doc.marks), files=[path], origin=path)
    base_ref = doc.data.get("extends")
    if base_ref is None:
        return own
    where = doc.marks.get(("extends",), doc.marks[()])
    if not isinstance(base_ref, str):
        raise ConfigError(f"{where}: `extends` must be a profile name or path",
                          "e.g. `extends: reference`; `dsv4bisect profile list` names the shipped ones")
    try:
        base_path = find_profile(base_ref, relative_to=path.parent)
    except ConfigError as exc:
        raise ConfigError(f"{where}: extends: {exc.message}", exc.hint) from exc
    if base_path in _chain + (path,):
        cycle = " -> ".join(display_path(p) for p in _chain + (path, base_path))
        raise ConfigError(f"{where}: `extends` cycle: {cycle}", "remove one of the extends links")
    if len(_chain) + 1 >= MAX_EXTENDS:
        raise ConfigError(f"{where}: `extends` chain longer than {MAX_EXTENDS} profiles",
                          "flatten the chain: extend a profile that holds the shared settings")
    base = load_layers(base_path, _chain + (path,))
    return _merge(base, own)


def _merge(base: Layered, child: Layered) -> Layered:
    data = copy.deepcopy(base.data)
    provenance = dict(base.provenance)
    _merge_into(data, child.data, (), child.provenance, provenance)
    data.pop("extends", None)
    return Layered(data, provenance, base.files + child.files, child.origin)


def _merge_into(
    dst: dict[str, Any], src: dict[str, Any], path: KeyPath, src_prov: dict, prov: dict
) -> None:
    """Mappings merge key by key; any other value (lists included) replaces the base's."""
    for key, value in src.items():
        here = path + (key,)
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            prov[here] = src_prov.get(here, prov.get(here))
            _merge_into(dst[key], value, here, src_prov, prov)
            continue
        dst[key] = copy.deepcopy(value)
        for stale in [p for p in prov if p[: len(here)] == here]:
            del prov[stale]
        prov.update({p: m for p, m in src_prov.items() if p[: len(here)] == here})


def set_value(layered: Layered, dotted: str, raw_value: str, *, source: str) -> KeyPath:
    """Apply `--set dotted.key=value`; the value is parsed as a YAML scalar or flow collection."""
    if len(source) > 100:  # errors name the flag; a 5000-character flag is not readable
        source = source[:99] + "…"
    keys = tuple(k for k in dotted.split("."))
    if not dotted or any(not k for k in keys) or len(keys) > MAX_KEY_PARTS:
        raise ConfigError(f"{source}: bad key `{dotted[:80]}`", "use --set section.key=value")
    value = bounded.parse_yaml_value(raw_value, "override", source) if raw_value != "" else ""
    node: Any = layered.data
    for depth, key in enumerate(keys[:-1]):
        child = node.get(key) if isinstance(node, dict) else None
        if child is None:
            child = {}
            node[key] = child
        if not isinstance(child, dict):
            where = ".".join(keys[: depth + 1])
            raise ConfigError(f"{source}: `{where}` is not a section", "set a leaf key instead")
        node = child
    node[keys[-1]] = value
    for stale in [p for p in layered.provenance if p[: len(keys)] == keys]:
        del layered.provenance[stale]
    layered.provenance[keys] = source
    return keys
