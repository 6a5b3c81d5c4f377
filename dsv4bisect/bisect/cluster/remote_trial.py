"""One trial run on another machine: what is sent there, what runs there, what comes back.

The driver resolves and fingerprints every configuration (its ledger key) and sends a
`NodeTrial`: the patch set, the seed block, and the identity it resolved. The node resolves
the same patch set with its own runner (`node_runner`) and refuses to run when the two
differ (a node with another model, engine version or dsv4bisect code would measure something
else under the same key): a `NodeMismatch` naming the node and what differs. It then runs the
same local trial code as a local bisect into a scratch trial directory and sends back ONE
archive of that directory (tar.gz) with the `TrialResult` as JSON; the driver unpacks the
archive into its own trial directory and rewrites the result's paths to point there. No Ray
here: the executor (bisect/cluster/ray_executor.py) only carries these values. The ends a hot runner
measures travel beside the trial's archive, both ways (bisect/cluster/shared_ends.py).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from dsv4bisect.bisect.cluster import shared_ends
from dsv4bisect.bisect.cluster.archive import pack, unpack
from dsv4bisect.bisect.trials.engine_runner import EngineRunner
from dsv4bisect.bisect.trials.runner import TrialResult
from dsv4bisect.errors import (
    BisectError,
    ConfigError,
    Dsv4BisectError,
    EngineError,
    PatchError,
    ProbeError,
)
from dsv4bisect.run.trial import Stop

_ERRORS: dict[str, type[Dsv4BisectError]] = {
    c.__name__: c for c in (ConfigError, EngineError, BisectError, PatchError, ProbeError)}


class NodeMismatch(ConfigError):
    """A node resolves a configuration to another identity than the driver (exit 5)."""


@dataclass(frozen=True)
class NodeTrial:
    patches: Mapping[str, str]
    seed_block: int
    fingerprint: str  # the driver's: the ledger key
    identity: Mapping[str, Any]  # what that fingerprint covers (to say what differs)
    probe_hash: str
    run_name: str  # the driver's bisect directory name and trial directory name, reused on
    trial_name: str  # the node so that its records sit where `stop_orphans` looks

    def to_json(self) -> dict[str, Any]:
        return {"patches": dict(self.patches), "seed_block": self.seed_block,
                "fingerprint": self.fingerprint, "identity": dict(self.identity),
                "probe_hash": self.probe_hash, "run_name": self.run_name,
                "trial_name": self.trial_name}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> NodeTrial:
        return cls(dict(doc["patches"]), int(doc["seed_block"]), str(doc["fingerprint"]),
                   dict(doc["identity"]), str(doc["probe_hash"]), str(doc["run_name"]),
                   str(doc["trial_name"]))


def scratch_trial_dir(scratch: Path, trial: NodeTrial) -> Path:
    """`<scratch>/<bisect dir>/trials/<trial dir>`: the layout `groups.PATTERNS` knows."""
    return scratch / trial.run_name / "trials" / trial.trial_name


def check_identity(runner: EngineRunner, trial: NodeTrial, node: str) -> None:
    """Refuse a trial whose configuration this node resolves differently from the driver."""
    cfg = runner.config(trial.patches)
    if cfg.fingerprint == trial.fingerprint and runner.probe_hash == trial.probe_hash:
        return
    differ = sorted(k for k in set(cfg.identity) | set(trial.identity)
                    if cfg.identity.get(k) != trial.identity.get(k))
    what = ", ".join(differ) if differ else "the probe or the good end"
    raise NodeMismatch(
        f"node {node} resolves {sorted(trial.patches)} to fingerprint {cfg.fingerprint}, the "
        f"driver to {trial.fingerprint} (differs: {what})",
        "give every node the same model path, SGLang environment and dsv4bisect as the "
        "machine that runs `dsv4bisect bisect` (docs/cluster.md)")


def run_on_node(runner: EngineRunner, trial: NodeTrial, scratch: Path,
                node: Mapping[str, Any], ends: bytes | None = None,
                replicas: Sequence[str] = ()) -> dict[str, Any]:
    """Check, run and pack one trial on this node; the reply the driver receives.
    `ends`: the driver's archive of ends other nodes measured (cluster/shared_ends.py), installed
    in a hot runner before the trial; the reply's `ends` holds those this trial measured, and
    `engines` the load-time states whose engine is up after it (where the runner says).
    `replicas`: urls of other nodes' engines switched to the trial's configuration
    (`replica_on_node`), which a hot runner's sequential probe is split across.
    A project error becomes `{"error": ...}` (re-raised on the driver, naming the node)."""
    measured: bytes | None = None
    try:
        check_identity(runner, trial, str(node["name"]))
        trial_dir = scratch_trial_dir(scratch, trial)
        trial_dir.mkdir(parents=True, exist_ok=True)
        if ends is not None and runner.hot:
            shared_ends.adopt(runner, ends, scratch / trial.run_name / "adopted" / trial.trial_name)
        started = time.time()
        result = runner.run(dict(trial.patches), trial.seed_block, trial_dir, replicas=replicas)
        finished = time.time()
        names = result.details.get("ends_measured") or []
        kept = runner.ends_dir(trial_dir)
        if names and kept is not None:
            measured = shared_ends.pack_ends(kept, names,
                                             good=runner.good_cfg.fingerprint,
                                             node=str(node["name"]))
    except Dsv4BisectError as exc:
        return {"error": error_json(exc)}
    archive = pack(trial_dir)
    shutil.rmtree(trial_dir, ignore_errors=True)  # the driver holds the copy now
    for parent in (trial_dir.parent, trial_dir.parent.parent):  # trials/, the bisect's dir
        try:
            parent.rmdir()  # only when empty: another trial of the bisect may be running
        except OSError:
            break
    return {"result": result.to_json(), "node_dir": str(trial_dir), "archive": archive,
            "node": {**node, "started": started, "finished": finished}, "ends": measured,
            "engines": list(runner.engines_up)}


def ahead_on_node(runner: EngineRunner, trial: NodeTrial, scratch: Path,
                  node: Mapping[str, Any], replicas: Sequence[str] = ()) -> dict[str, Any]:
    """Start `trial`'s full-size probe before the good end's run exists: its engine up and
    its accuracy requests sent (`HotEngineRunner.ahead`; probe/ahead.py), kept by the runner
    for the trial's `run_on_node`, which finishes it. `{"rows", "started", "finished",
    "engines"}` (rows 0: nothing kept, the trial probes whole), or `{"error"}`."""
    try:
        check_identity(runner, trial, str(node["name"]))
        started = time.time()
        rows = runner.ahead(dict(trial.patches), trial.seed_block,
                            scratch_trial_dir(scratch, trial), replicas=replicas)
    except Dsv4BisectError as exc:
        return {"error": error_json(exc)}
    return {"rows": rows, "started": started, "finished": time.time(),
            "engines": list(runner.engines_up)}


def replica_on_node(runner: EngineRunner, trial: NodeTrial, scratch: Path,
                    node: Mapping[str, Any]) -> dict[str, Any]:
    """This node's engine of `trial`'s configuration, up and switched (its identity checked
    like a trial's, the switch's receipts verified), for another node's trial to probe a share
    of its requests on: `{"url", "node", "engines"}`, or `{"error"}` (then the trial runs
    without this node). Only a hot runner keeps an engine up between calls."""
    try:
        check_identity(runner, trial, str(node["name"]))
        # (its engine goes where the node's trials keep theirs: <bisect dir>/engines)
        url = runner.replica(dict(trial.patches), scratch_trial_dir(scratch, trial))
        url = replica_url(url, node.get("ip"))
    except Dsv4BisectError as exc:
        return {"error": error_json(exc)}
    except Stop as stop:  # the engine crashed or cannot serve: not this trial's evidence
        return {"error": {"class": "EngineError", "hint": None,
                          "message": "the replica's engine cannot serve "
                                     f"({stop.verdict.verdict})"}}
    return {"url": url, "node": dict(node), "engines": list(runner.engines_up)}


def replica_url(url: str, node_ip: str | None) -> str:
    """The url another node reaches this node's engine at: an engine listening on every
    address (`engine.host` 0.0.0.0 or ::) at this node's IP; any other as it is (an engine on
    loopback serves only trials of its own machine: `reaches`)."""
    parts = urlsplit(url)
    if node_ip and parts.hostname in ("0.0.0.0", "::"):
        host = f"[{node_ip}]" if ":" in node_ip else node_ip
        return urlunsplit(parts._replace(netloc=f"{host}:{parts.port}"))
    return url


def reaches(url: str, from_ip: str | None, node_ip: str | None) -> bool:
    """Whether a trial on the machine at `from_ip` can send requests to `url`, an engine of
    the node at `node_ip` (a loopback url only from the same machine)."""
    host = urlsplit(url).hostname or ""
    loopback = host == "localhost" or host.startswith("127.") or host == "::1"
    return not loopback or (from_ip is not None and from_ip == node_ip)


def receive(reply: Mapping[str, Any], trial_dir: Path, node: str) -> TrialResult:
    """The driver's side: raise a node's error naming it, or unpack and relocate the result."""
    if "error" in reply:
        raise node_error(reply["error"], node)
    unpack(reply["archive"], trial_dir)
    doc = relocate(reply["result"], str(reply["node_dir"]), str(trial_dir))
    doc["details"] = {**doc["details"], "node": dict(reply["node"])}
    return TrialResult.from_json(doc)


# -- values on the wire -----------------------------------------------------------------------


def error_json(exc: Dsv4BisectError) -> dict[str, Any]:
    return {"class": type(exc).__name__, "message": exc.message, "hint": exc.hint}


def node_error(doc: Mapping[str, Any], node: str) -> Dsv4BisectError:
    """The node's error, same class and hint; the message names the node (once)."""
    cls = _ERRORS.get(str(doc.get("class")), ConfigError)
    message = str(doc.get("message"))
    if f"node {node}" not in message:
        message = f"node {node}: {message}"
    return cls(message, doc.get("hint"))


def relocate(doc: Any, old: str, new: str) -> Any:
    """Every string path under `old` (the node's trial directory) moved under `new`."""
    if isinstance(doc, str):
        return new + doc[len(old):] if doc == old or doc.startswith(old + "/") else doc
    if isinstance(doc, dict):
        return {k: relocate(v, old, new) for k, v in doc.items()}
    if isinstance(doc, list):
        return [relocate(v, old, new) for v in doc]
    return doc
