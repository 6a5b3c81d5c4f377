"""Benchmark: seeded mutation fuzzing of the shipped profiles against the real CLI.

Not collected by pytest. Each mutation of a shipped profile (every class in `MUTATORS`) is
written to its own directory and run as a subprocess through `dsv4bisect profile validate` and
`dsv4bisect profile show --resolved`, with a 20 s timeout and a 3 GiB address-space cap (so a
YAML alias bomb on old code fails instead of eating the machine). A run counts

    traceback   "Traceback" on stderr, or exit 70 (the handler's "internal error")
    hang        no answer within the timeout
    bad exit    an exit code outside the documented 0, 1, 2, 4, 5, 125, 130
    no hint     exit 5 (bad input) without a `hint:` line (every exit-5 path has one)

Run (the numbers in docs/performance.md came from the first line):

    python tests/benchmarks/fuzz_profiles.py --count 1000 --jobs 2 --json fuzz.json
    python tests/benchmarks/fuzz_profiles.py --count 60 --classes alias_bomb,deep_nesting

Exit 0 when nothing was found, 1 otherwise. The same seed gives the same mutations.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

PROFILES = Path(__file__).resolve().parents[2] / "profiles"
ALLOWED = {0, 1, 2, 4, 5, 125, 130}
COMMANDS = (("profile", "validate"), ("profile", "show", "--resolved"))
MEMORY_CAP = 3 << 30
MAIN = "mutant.yaml"

Files = dict[str, bytes]  # file name (in the mutation's directory) -> content


@dataclass
class Mutation:
    index: int
    cls: str
    base: str
    files: Files
    note: str = ""


@dataclass
class Outcome:
    mutation: Mutation
    command: str
    code: int | None  # None: timed out
    seconds: float
    stderr_tail: str = ""
    problems: list[str] = field(default_factory=list)


# ---- mutators: (rng, base text) -> files; MAIN is the one the commands get ------------------

def _set_key(text: str, key: str, value: str) -> str:
    """`text` with the dotted `key` set to the YAML `value`: the existing line is replaced,
    a missing key is inserted under its section (so the mutant tests the value, not our
    duplicate-key check), a missing section is appended as a flow mapping."""
    lines = text.splitlines()
    parts = key.split(".")
    lo, hi = 0, len(lines)
    for depth, part in enumerate(parts):
        prefix = "  " * depth + f"{part}:"
        found = next((i for i in range(lo, hi) if lines[i].startswith(prefix)
                      and (len(lines[i]) == len(prefix) or lines[i][len(prefix)] == " ")), None)
        if found is None:
            nested = value
            for k in reversed(parts[depth + 1:]):
                nested = f"{{{k}: {nested}}}"
            lines.insert(lo if depth else hi, "  " * depth + f"{part}: {nested}")
            return "\n".join(lines) + "\n"
        if depth == len(parts) - 1:
            lines[found] = "  " * depth + f"{part}: {value}"
            # drop the old value's block (deeper-indented lines below it)
            end = found + 1
            while end < hi and (lines[end].startswith("  " * (depth + 1)) or not lines[end]):
                end += 1
            del lines[found + 1:end]
            return "\n".join(lines) + "\n"
        if lines[found].strip() != prefix.strip():  # a flow value: cannot nest into it
            lines[found] = prefix + " " + "{" + f"{parts[depth + 1]}: {value}" + "}"
            return "\n".join(lines) + "\n"
        lo = found + 1
        hi = next((i for i in range(lo, hi) if lines[i].strip() and not lines[i].startswith(
            "  " * (depth + 1)) and not lines[i].lstrip().startswith("#")), hi)
    return "\n".join(lines) + "\n"


def deep_nesting(rng: random.Random, text: str) -> Files:
    depth = rng.choice([30, 100, 600, 2000, 5000, 20000])
    style = rng.choice(["flow-list", "flow-map", "block"])
    if style == "flow-list":
        value = "[" * depth + "]" * depth
    elif style == "flow-map":
        value = "{a: " * depth + "1" + "}" * depth
    else:
        value = "\n" + "".join("  " * (d + 1) + f"k{d}:\n" for d in range(min(depth, 3000)))
        value = value.rstrip(":\n") + ": 1"
    key = rng.choice(["description", "engine.args", "probe.lengths", "extra"])
    return {MAIN: _set_key(text, key, value).encode()}


def recursive_alias(rng: random.Random, text: str) -> Files:
    form = rng.choice(["rec: &r [*r]", "rec: &r {a: *r}", "engine: &e {kind: reference, x: *e}",
                       "a: &a [1]\nb: *a", "description: *undefined"])
    return {MAIN: (text + form + "\n").encode()}


def alias_bomb(rng: random.Random, text: str) -> Files:
    levels = rng.randint(4, 12)
    width = rng.choice([5, 9, 10])
    lines = ['lol0: &l0 "lol"']
    for n in range(1, levels):
        refs = ",".join(f"*l{n - 1}" for _ in range(width))
        lines.append(f"lol{n}: &l{n} [{refs}]")
    where = rng.choice(["description", "engine.args", "bomb"])
    bomb = "\n".join(lines) + "\n"
    top = f"{where.split('.')[0]}: *l{levels - 1}\n" if "." not in where else ""
    if "." in where:
        return {MAIN: (bomb + _set_key(text, where, f"*l{levels - 1}")).encode()}
    return {MAIN: (bomb + text.replace(f"\n{where}:", f"\nx_{where}:") + top).encode()}


def long_extends(rng: random.Random, text: str) -> Files:
    n = rng.choice([17, 40, 200, 2000])
    files: Files = {}
    for i in range(n):
        files[f"chain{i}.yaml"] = (f"schema_version: 1\nname: chain{i}\n"
                                   f"extends: chain{i + 1}.yaml\n").encode()
    files[f"chain{n}.yaml"] = text.encode()
    files[MAIN] = "schema_version: 1\nname: mutant\nextends: chain0.yaml\n".encode()
    if rng.random() < 0.3:  # and a cycle back into the chain
        files[f"chain{n}.yaml"] = f"schema_version: 1\nname: c\nextends: {MAIN}\n".encode()
    return files


def invalid_encoding(rng: random.Random, text: str) -> Files:
    kind = rng.choice(["utf16", "utf16-nobom", "utf32", "latin1", "cut-utf8", "surrogate",
                       "overlong"])
    if kind == "utf16":
        data = text.encode("utf-16")
    elif kind == "utf16-nobom":
        data = text.encode("utf-16-le")
    elif kind == "utf32":
        data = text.encode("utf-32")
    elif kind == "latin1":
        data = (text + "description: caf\xe9 na\xefve\n").encode("latin-1", "replace")
    elif kind == "cut-utf8":
        data = text.encode() + "name2: é".encode()[:-1] + b"\n"
    elif kind == "surrogate":
        data = text.encode() + b"x: \xed\xa0\x80\n"
    else:
        data = text.encode() + b"x: \xc0\xaf\n"
    pos = rng.randrange(len(data)) if kind == "latin1" else None
    if pos is not None:
        data = data[:pos] + bytes([rng.randint(0x80, 0xff)]) + data[pos:]
    return {MAIN: data}


def nul_bytes(rng: random.Random, text: str) -> Files:
    kind = rng.choice(["raw", "escape-value", "escape-key", "proc-environ"])
    data = text.encode()
    if kind == "raw":
        pos = rng.randrange(len(data))
        return {MAIN: data[:pos] + b"\x00" * rng.randint(1, 4) + data[pos:]}
    if kind == "escape-value":
        key = rng.choice(["description", "engine.host", "engine.served_model_name"])
        return {MAIN: _set_key(text, key, '"a\\0b"').encode()}
    if kind == "escape-key":
        return {MAIN: (text + '"bad\\0key": 1\n').encode()}
    return {MAIN: text.replace("extends:", "x_extends:").encode()
            + b"extends: /proc/self/environ\n"}


def binary_file(rng: random.Random, text: str) -> Files:
    size = rng.choice([16, 256, 4096, 100_000])
    data = bytes(rng.randrange(256) for _ in range(size))
    if rng.random() < 0.5:
        data = text.encode()[: rng.randrange(len(text))] + data
    return {MAIN: data}


HUGE = ["1e28", "1.0e+28", "-1", "0", ".nan", ".inf", "-.inf", "10000000000", "9" * 5000,
        "1e400", "-9" + "9" * 30, "0x7fffffffffffffff", "100000", "1e-300"]
NUMERIC_KEYS = ["engine.tp", "engine.dp", "engine.port", "engine.chunked_prefill_size",
                "engine.startup_timeout_s", "engine.reference.threads",
                "engine.reference.max_model_len", "probe.seed", "probe.request_timeout_s",
                "bisect.parallel", "bisect.max_trials", "bisect.confidence"]


def huge_numbers(rng: random.Random, text: str) -> Files:
    key = rng.choice(NUMERIC_KEYS + ["probe.lengths", "probe.depths", "engine.gpus"])
    value = rng.choice(HUGE)
    if key in ("probe.lengths", "probe.depths", "engine.gpus"):
        value = f"[{value}]"
    if key.startswith("engine.reference") and "kind: reference" not in text:
        key = "engine.tp"
    return {MAIN: _set_key(text, key, value).encode()}


def bad_env(rng: random.Random, text: str) -> Files:
    entry = rng.choice(['{"A=B": "1"}', '{"A\\0B": "1"}', '{A: "x\\0y"}', "{A: true}",
                        '{"": "1"}', "{1: 2}", "{A: [1, 2]}", "{A: {b: 1}}", "[A=1]",
                        '{"=": "x"}', "{A: null}"])
    key = rng.choice(["engine.env", "engine.env"])
    return {MAIN: _set_key(text, key, entry).encode()}


def bad_args(rng: random.Random, text: str) -> Files:
    entry = rng.choice(['["a\\0b"]', "[1, 2]", "{a: b}", '"--one-string"', "[[--nested]]",
                        '["--api-key", "\\0"]', "[null]", "[true]"])
    key = rng.choice(["engine.args", "engine.args"])
    return {MAIN: _set_key(text, key, entry).encode()}


def special_extends(rng: random.Random, text: str) -> Files:
    target = rng.choice(["/proc/self/environ", "/dev/zero", "/dev/null", "/etc/passwd",
                         "/etc", MAIN, "/proc/self/cmdline", "x" * 5000, "../" * 300,
                         "missing.yaml", "[a, b]", "{a: 1}", "1", "reference\\0x"])
    if target == "reference\\0x":
        target = '"reference\\0x"'
    body = "\n".join(line for line in text.splitlines() if not line.startswith("extends:"))
    return {MAIN: (body + f"\nextends: {target}\n").encode()}


def structural(rng: random.Random, text: str) -> Files:
    kind = rng.choice(["truncate", "drop-lines", "list-top", "scalar-top", "dup-key",
                       "unknown-key", "type-swap", "two-docs", "tabs", "control-char",
                       "huge-string", "many-keys", "tag"])
    lines = text.splitlines()
    if kind == "truncate":
        out = text[: rng.randrange(len(text))]
    elif kind == "drop-lines":
        out = "\n".join(line for line in lines if rng.random() > 0.3)
    elif kind == "list-top":
        out = "- " + "\n- ".join(lines[:5])
    elif kind == "scalar-top":
        out = rng.choice(["42", "hello", "null", "~", "''"])
    elif kind == "dup-key":
        out = text + "schema_version: 1\n"
    elif kind == "unknown-key":
        out = _set_key(text, rng.choice(["engine.tpp", "probee", "bisect.paralel"]), "1")
    elif kind == "type-swap":
        out = _set_key(text, rng.choice(["engine", "patches", "probe", "engine.env"]),
                       rng.choice(["[1, 2]", "7", "yes", "null"]))
    elif kind == "two-docs":
        out = text + "---\nschema_version: 1\n"
    elif kind == "tabs":
        out = text.replace("  ", "\t", 3)
    elif kind == "control-char":
        pos = rng.randrange(len(text))
        out = text[:pos] + chr(rng.choice([1, 7, 8, 0x1b, 0x7f, 0x85, 0xfffe])) + text[pos:]
    elif kind == "huge-string":
        out = _set_key(text, "description", '"' + "x" * rng.choice([10_000, 2_000_000]) + '"')
    elif kind == "many-keys":
        out = text + "patches2:\n" + "".join(f"  p{i}: true\n" for i in range(60_000))
    else:
        out = text + rng.choice(["x: !!python/object:os.system ls\n", "x: !custom 1\n",
                                 "x: !!binary aGVsbG8=\n", "x: 2001-13-45\n"])
    return {MAIN: out.encode("utf-8", "surrogatepass")}


MUTATORS: dict[str, Callable[[random.Random, str], Files]] = {
    "deep_nesting": deep_nesting, "recursive_alias": recursive_alias, "alias_bomb": alias_bomb,
    "long_extends": long_extends, "invalid_encoding": invalid_encoding, "nul_bytes": nul_bytes,
    "binary_file": binary_file, "huge_numbers": huge_numbers, "bad_env": bad_env,
    "bad_args": bad_args, "special_extends": special_extends, "structural": structural,
}


def mutations(count: int, seed: int, classes: list[str]) -> list[Mutation]:
    rng = random.Random(seed)
    bases = {p.name: p.read_text() for p in sorted(PROFILES.glob("*.yaml"))}
    shipped = [n for n in bases if not n.startswith("_")]
    out = []
    for index in range(count):
        cls = classes[index % len(classes)]  # round robin: every class gets its share
        base = rng.choice(shipped)
        files = MUTATORS[cls](rng, bases[base])
        for name, text in bases.items():  # shipped profiles extend `_dsv4-flash-base.yaml`
            if name.startswith("_"):
                files.setdefault(name, text.encode())
        out.append(Mutation(index, cls, base, files))
    return out


# ---- running --------------------------------------------------------------------------------

def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def run_one(m: Mutation, root: Path, timeout: float) -> list[Outcome]:
    where = root / f"m{m.index:05d}"
    where.mkdir()
    for name, data in m.files.items():
        (where / name).write_bytes(data)
    env = {**os.environ, "DSV4BISECT_CACHE": str(root / "cache"), "NO_COLOR": "1"}
    results = []
    for command in COMMANDS:
        argv = [sys.executable, "-m", "dsv4bisect", *command[:2], MAIN, *command[2:]]
        start = time.perf_counter()
        try:
            proc = subprocess.run(argv, cwd=where, env=env, capture_output=True,
                                  timeout=timeout, preexec_fn=_limit_memory)
            code, err = proc.returncode, proc.stderr.decode(errors="replace")
        except subprocess.TimeoutExpired as exc:
            code = None
            err = (exc.stderr or b"").decode(errors="replace")
        seconds = time.perf_counter() - start
        problems = []
        if code is None:
            problems.append("hang")
        else:
            if "Traceback" in err or code == 70:
                problems.append("traceback")
            if code not in ALLOWED:
                problems.append("bad exit")
            if code == 5 and not any(line.startswith("hint: ") for line in err.splitlines()):
                problems.append("no hint")
        results.append(Outcome(m, " ".join(command), code, seconds, err[-600:], problems))
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--classes", default=",".join(MUTATORS))
    ap.add_argument("--json", type=Path, help="write every finding here")
    args = ap.parse_args()
    classes = args.classes.split(",")
    unknown = [c for c in classes if c not in MUTATORS]
    if unknown:
        ap.error(f"unknown classes {unknown}; known: {', '.join(MUTATORS)}")
    muts = mutations(args.count, args.seed, classes)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dsv4fuzz-") as tmp:
        outcomes: list[Outcome] = []
        with ThreadPoolExecutor(args.jobs) as pool:
            batches = pool.map(lambda m: run_one(m, Path(tmp), args.timeout), muts)
            for done, batch in enumerate(batches, 1):
                outcomes += batch
                if done % 100 == 0:  # progress on stderr; a long run can be watched
                    found = Counter(p for o in outcomes for p in o.problems)
                    print(f"{done}/{len(muts)} mutations, {time.perf_counter() - start:.0f} s: "
                          f"{dict(found) or 'nothing found'}", file=sys.stderr, flush=True)
    wall = time.perf_counter() - start
    return report(outcomes, muts, wall, args)


def report(outcomes: list[Outcome], muts: list[Mutation], wall: float,
           args: argparse.Namespace) -> int:
    by = Counter()
    per_class: dict[str, Counter] = {}
    codes = Counter(o.code for o in outcomes)
    for o in outcomes:
        c = per_class.setdefault(o.mutation.cls, Counter())
        c["runs"] += 1
        for p in o.problems:
            by[p] += 1
            c[p] += 1
    slowest = max(outcomes, key=lambda o: o.seconds)
    print(f"mutations {len(muts)} x {len(COMMANDS)} commands = {len(outcomes)} runs, "
          f"seed {args.seed}, {args.jobs} jobs, wall {wall:.0f} s "
          f"({platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()})")
    print(f"tracebacks {by['traceback']}  hangs (> {args.timeout:.0f} s) {by['hang']}  "
          f"bad exits {by['bad exit']}  exit 5 without a hint {by['no hint']}  "
          f"slowest answer {slowest.seconds:.1f} s")
    print("exit codes: " + ", ".join(f"{'timeout' if k is None else k}: {v}"
                                      for k, v in sorted(codes.items(), key=lambda kv: str(kv[0]))))
    print(f"{'class':<18}{'runs':>6}{'tracebacks':>12}{'hangs':>7}{'bad exits':>11}"
          f"{'no hint':>9}")
    for cls, c in per_class.items():
        print(f"{cls:<18}{c['runs']:>6}{c['traceback']:>12}{c['hang']:>7}{c['bad exit']:>11}"
              f"{c['no hint']:>9}")
    found = [o for o in outcomes if o.problems]
    for o in found[:10]:
        last = (o.stderr_tail.strip().splitlines() or [""])[-1]
        print(f"  m{o.mutation.index:05d} {o.mutation.cls} ({o.mutation.base}) `{o.command}`: "
              f"{','.join(o.problems)}: {last[:140]}")
    if args.json:
        args.json.write_text(json.dumps({
            "mutations": len(muts), "runs": len(outcomes), "wall_s": round(wall, 1),
            "seed": args.seed, "tracebacks": by["traceback"], "hangs": by["hang"],
            "bad_exits": by["bad exit"], "no_hint": by["no hint"], "per_class": per_class,
            "findings": [{"index": o.mutation.index, "class": o.mutation.cls,
                          "base": o.mutation.base, "command": o.command, "code": o.code,
                          "problems": o.problems, "stderr": o.stderr_tail} for o in found],
        }, indent=1, default=dict))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
