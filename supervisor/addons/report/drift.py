"""Drift between attempts: what changed in code, config, software, GPUs or determinism settings
between attempts of what should be one run. Pure: manifests (and client-reported settings) in,
:class:`DriftItem` tuples out.

An unknown value (a node without git or nvidia-smi, a probe that timed out) is never drift; the
comparison is with the newest earlier attempt that knew the same fact.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DriftItem:
    """Something that changed between two attempts of what should be one run."""

    what: str  # a human label: "git commit", "torch", "config file train.yaml", "env NCCL_ALGO"
    from_attempt: int
    to_attempt: int
    old: Any
    new: Any
    breaks_reproducibility: bool = True


def _get(m: Mapping[str, Any], *path: str) -> Any:
    node: Any = m
    for p in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(p)
    return node


def _manifest_facts(m: Mapping[str, Any]) -> dict[str, tuple[Any, bool, bool]]:
    """label -> (value, known, breaks_reproducibility). ``known`` False = the probe could not tell,
    which is not drift (a node without git or nvidia-smi does not mean the code changed)."""
    facts: dict[str, tuple[Any, bool, bool]] = {}

    def probe(label: str, value: Any, breaks: bool = True) -> None:
        facts[label] = (value, value is not None, breaks)

    probe("git commit", _get(m, "git", "commit"))
    probe("uncommitted changes (git dirty)", _get(m, "git", "dirty"))
    probe("supervisor config (hash)", m.get("config_hash"))
    for entry in m.get("config_files") or ():
        if isinstance(entry, Mapping) and entry.get("path"):
            value = "missing" if entry.get("missing") else entry.get("sha256")
            facts[f"config file {entry['path']}"] = (value, value is not None, True)
    for key, label in (("python", "python"), ("torch", "torch"), ("cuda", "CUDA"),
                       ("cudnn", "cuDNN"), ("nccl", "NCCL"), ("hip", "HIP")):
        sw = m.get("software")
        if isinstance(sw, Mapping) and sw.get("python") is not None:
            # The probe ran: a version of None is a real "not built with it", not unknown.
            facts[label] = (sw.get(key), True, True)
    probe("python interpreter", _get(m, "software", "python_executable"), breaks=False)
    gpus = _get(m, "gpu", "gpus")
    if isinstance(gpus, list):
        names = sorted({str(g.get("name")) for g in gpus if isinstance(g, Mapping)})
        probe("GPU model", ", ".join(names) or None)
        probe("NVIDIA driver", _get(m, "gpu", "driver"))
    det = m.get("determinism")
    if isinstance(det, Mapping):
        for key, value in det.items():
            facts[f"env {key}"] = (value, True, True)
    probe("host", _get(m, "hosts", "hostname"), breaks=False)
    return facts


_CLIENT_VERSION_KEYS = frozenset({"torch", "cuda", "cudnn"})


def find_drift(manifests: Mapping[int, Mapping[str, Any]],
               client_determinism: Mapping[int, Mapping[str, Any]] | None = None) -> tuple[DriftItem, ...]:
    """Compare each attempt with the newest earlier attempt that knew the same fact."""
    per_attempt: dict[int, dict[str, tuple[Any, bool, bool]]] = {}
    for n, m in manifests.items():
        if isinstance(m, Mapping):
            per_attempt.setdefault(n, {}).update(_manifest_facts(m))
    for n, det in (client_determinism or {}).items():
        facts = per_attempt.setdefault(n, {})
        for key, value in det.items():
            if key in _CLIENT_VERSION_KEYS and "torch" in facts:
                continue  # the manifest's probe already compares the versions
            facts[f"determinism {key} (reported by the client)"] = (value, True, True)
    env_labels = {label for facts in per_attempt.values() for label in facts if label.startswith("env ")}
    last_known: dict[str, tuple[int, Any]] = {}
    items: list[DriftItem] = []
    for n in sorted(per_attempt):
        facts = per_attempt[n]
        if n in manifests:  # a manifest that lacks an NCCL_* variable means it was unset
            for label in env_labels:
                facts.setdefault(label, (None, True, True))
        for label, (value, known, breaks) in facts.items():
            if not known:
                continue
            if label in last_known and last_known[label][1] != value:
                items.append(DriftItem(what=label, from_attempt=last_known[label][0], to_attempt=n,
                                       old=last_known[label][1], new=value, breaks_reproducibility=breaks))
            last_known[label] = (n, value)
    return tuple(items)
