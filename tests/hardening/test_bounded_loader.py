"""The bounded loader: real files of each kind load; hostile ones are one positioned error, fast."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4bisect.base import bounded
from dsv4bisect.config.checkpoints import (
    EMBEDDED_CHECKPOINT,
    load_checkpoint_config,
    load_weight_map,
)
from dsv4bisect.config.layering import MAX_EXTENDS, load_layers
from dsv4bisect.config.yamlsource import load_yaml
from dsv4bisect.errors import ConfigError

FLASH_LAYERS, FLASH_EXPERTS = 43, 256  # DeepSeek-V4-Flash


def _flash_index(directory: Path) -> int:
    """A weight map shaped like V4-Flash's: per layer attention, mHC and 256 experts × 3."""
    names = ["embed.weight", "head.weight", "norm.weight", "hc_head_fn"]
    for layer in range(FLASH_LAYERS):
        p = f"layers.{layer}"
        names += [f"{p}.attn.{w}.weight" for w in ("wq_a", "wq_b", "wkv", "wo_a", "wo_b")]
        names += [f"{p}.hc_attn_fn", f"{p}.hc_ffn_fn", f"{p}.ffn.gate.weight"]
        for e in range(FLASH_EXPERTS):
            for w in ("w1", "w2", "w3"):
                names += [f"{p}.ffn.experts.{e}.{w}.weight", f"{p}.ffn.experts.{e}.{w}.scale"]
    shards = 64
    weight_map = {n: f"model-{i % shards + 1:05d}-of-{shards:05d}.safetensors"
                  for i, n in enumerate(names)}
    (directory / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 160_000_000_000}, "weight_map": weight_map}, indent=2))
    return len(weight_map)


def test_a_v4_flash_sized_shard_index_loads(tmp_path: Path) -> None:
    n = _flash_index(tmp_path)
    assert n > 60_000  # order 10^5, as the real checkpoint
    weight_map = load_weight_map(tmp_path)  # its time: tests/benchmarks/budgets.py
    assert len(weight_map) == n


def test_the_shipped_checkpoint_config_and_index_load() -> None:
    config = load_checkpoint_config(EMBEDDED_CHECKPOINT)
    assert config["model_type"] == "deepseek_v4"
    assert all(s.endswith(".safetensors") for s in load_weight_map(EMBEDDED_CHECKPOINT).values())


def test_an_index_pointing_outside_its_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"embed.weight": "../../etc/passwd"}}))
    with pytest.raises(ConfigError, match="not a shard file name"):
        load_weight_map(tmp_path)


@pytest.mark.parametrize("text, where, what", [
    ("[" * 5000 + "]" * 5000, ":1:65:", "nested deeper than 64"),
    ('{"a": 1,', ":1:9:", "not valid JSON"),
    ('{"a": NaN}', "", "NaN is not a number"),
    ('{"a": ' + "9" * 5000 + "}", "", "not valid JSON"),
])
def test_hostile_json_is_a_positioned_error(tmp_path: Path, text: str, where: str,
                                            what: str) -> None:
    path = tmp_path / "run.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=what) as info:
        bounded.load_json(path, "run")
    assert f"{path}{where}" in info.value.message


@pytest.mark.parametrize("data, where, what", [
    ("schema_version: 1\n".encode("utf-16"), ":1:1:", "UTF-16"),
    (b"schema_version: 1\nname: a\x00b\n", ":2:8:", "NUL byte"),
    (b"schema_version: 1\nname: caf\xe9\n", ":2:10:", "not UTF-8"),
    (bytes(range(256)), ":1:1:", "NUL byte"),
    (b"schema_version: 1\nname: x\x01\n", ":2:8:", "not allowed in YAML"),
])
def test_bytes_that_are_not_utf8_text_are_file_line_col(tmp_path: Path, data: bytes, where: str,
                                                        what: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_bytes(data)
    with pytest.raises(ConfigError, match=what) as info:
        load_yaml(path)
    assert f"{path}{where}" in info.value.message


def test_proc_self_environ_is_refused_not_read_as_a_profile() -> None:
    with pytest.raises(ConfigError, match=r"environ:\d+:\d+: NUL byte"):
        load_yaml(Path("/proc/self/environ"))


def _bomb(levels: int) -> str:
    lines = ['l0: &l0 "lol"']
    lines += [f"l{n}: &l{n} [{','.join(f'*l{n - 1}' for _ in range(10))}]"
              for n in range(1, levels)]
    return "\n".join(lines) + f"\ndescription: *l{levels - 1}\n"


@pytest.mark.parametrize("text, what", [
    (_bomb(30), "anchors"),  # 10^29 nodes if expanded
    ("rec: &r [*r]\n", "anchors"),
    ("description: *nowhere\n", "aliases|undefined alias"),
    ("description: " + "[" * 600 + "]" * 600 + "\n", "nested deeper than 24"),
    ("engine:\n  tp: " + "9" * 5000 + "\n", "a number with 5000 characters"),
    ("a: 1\n---\nb: 2\n", "another document"),
])
def test_hostile_yaml_is_refused(tmp_path: Path, text: str, what: str) -> None:
    path = tmp_path / "p.yaml"  # how fast: tests/benchmarks/budgets.py
    path.write_text(text)
    with pytest.raises(ConfigError, match=what) as info:
        load_yaml(path)
    assert info.value.message.startswith(f"{path}:")


def test_an_oversized_profile_is_refused_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("description: " + "x" * (2 << 20) + "\n")
    with pytest.raises(ConfigError, match="larger than the 1 MiB"):
        load_yaml(path)


def _chain(tmp_path: Path, n: int) -> Path:
    for i in range(n):
        (tmp_path / f"c{i}.yaml").write_text(f"schema_version: 1\nname: c{i}\n"
                                             f"extends: c{i + 1}.yaml\n")
    (tmp_path / f"c{n}.yaml").write_text("schema_version: 1\nname: end\nextends: reference\n")
    return tmp_path / "c0.yaml"


def test_extends_chains_are_bounded(tmp_path: Path) -> None:
    assert load_layers(_chain(tmp_path / "short", 5) if (tmp_path / "short").mkdir() is None
                       else tmp_path).data["name"] == "c0"
    (tmp_path / "long").mkdir()
    with pytest.raises(ConfigError, match=f"longer than {MAX_EXTENDS} profiles"):
        load_layers(_chain(tmp_path / "long", 2000))
