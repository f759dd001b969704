"""The rerun's environment (pure): the failed attempt's, as its manifest recorded it.

A fault can depend on a variable (a kernel path chosen by ``TORCH_*``, an allocator setting, a
flag of the training's own): rerun from a shell without it, it does not reproduce. The manifest
of each attempt records the environment the supervisor started the child with
(:func:`supervisor.addons.manifest.environment_record`), with the values of credential-named variables
replaced by ``[REDACTED]``; the rerun starts from that recording, takes the current shell's value
for a redacted one (and says so), and ``--env NAME=VALUE`` overrides on top. When the rerun does
not reproduce, :func:`env_differences` names every variable whose value differs from the
recording.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...redact import REDACTED, redact_text

# Never inherited by a rerun: the control channel of a live run, its process marker.
DROPPED_ENV = ("SUPERVISOR_CONTROL", "SUPERVISOR_KEY", "SUPERVISOR_TOKEN", "SUPERVISOR_PROCESS_TREE",
               "SUPERVISOR_CONTROL_HOST")
_PER_ATTEMPT_PREFIX = "SUPERVISOR_"  # re-made for the rerun by child_plan, never compared
_SHOWN_VALUE = 60  # characters of a value quoted in a difference


@dataclass(frozen=True)
class RerunEnvironment:
    """The variables the rerun starts from (before the supervisor's own and the tools'), and where
    they came from."""

    env: dict[str, str] = field(repr=False)
    source: str  # said to the user: "recorded by attempt 2" or why the current shell was used
    # What the rerun is compared with: the whole recording, or (complete=False: a manifest of an
    # earlier version) the determinism variables it recorded, None meaning unset.
    recorded: dict[str, str | None] = field(repr=False)
    complete: bool
    from_shell: tuple[str, ...] = ()  # redacted in the recording: the current shell's value used
    unset: tuple[str, ...] = ()  # redacted in the recording and not set in this shell: left unset
    overridden: tuple[str, ...] = ()  # given with --env


def recorded_variables(manifest: Mapping[str, Any] | None) -> dict[str, str] | None:
    """``manifest["environment"]["variables"]`` when it is a mapping of strings, else None."""
    block = (manifest or {}).get("environment")
    variables = block.get("variables") if isinstance(block, Mapping) else None
    if not isinstance(variables, Mapping):
        return None
    return {k: v for k, v in variables.items() if isinstance(k, str) and isinstance(v, str)}


def rerun_environment(manifest: Mapping[str, Any] | None, environ: Mapping[str, str],
                      overrides: Mapping[str, str] | None = None) -> RerunEnvironment:
    """The failed attempt's environment when its manifest recorded one, else the current shell's
    with the recorded determinism variables (manifests of earlier versions); ``overrides`` last."""
    overrides = dict(overrides or {})
    recorded = recorded_variables(manifest)
    from_shell: list[str] = []
    unset: list[str] = []
    if recorded is not None:
        env: dict[str, str] = {}
        for name, value in recorded.items():
            if name in DROPPED_ENV or name.startswith(_PER_ATTEMPT_PREFIX):
                continue
            if value != REDACTED:
                env[name] = value
            elif name in environ:
                env[name] = environ[name]
                from_shell.append(name)
            else:
                unset.append(name)
        attempt = (manifest or {}).get("attempt")
        source = f"recorded by attempt {attempt}" if isinstance(attempt, int) else "recorded in the manifest"
    else:
        env = {k: v for k, v in environ.items() if k not in DROPPED_ENV}
        determinism = (manifest or {}).get("determinism")
        if isinstance(determinism, Mapping):  # what the failed attempt ran with (CUDA_VISIBLE_DEVICES, NCCL_*...)
            env.update({str(k): str(v) for k, v in determinism.items() if isinstance(v, str)})
        source = ("this shell's, with the recorded determinism variables (the manifest recorded no environment)"
                  if manifest else "this shell's (no manifest of the attempt)")
    env.update(overrides)
    compared: dict[str, str | None]
    if recorded is not None:
        compared = {k: v for k, v in recorded.items() if k not in DROPPED_ENV and not k.startswith(_PER_ATTEMPT_PREFIX)}
    else:
        determinism = (manifest or {}).get("determinism")
        compared = ({str(k): v if isinstance(v, str) else None for k, v in determinism.items()}
                    if isinstance(determinism, Mapping) else {})
    return RerunEnvironment(env=env, source=source, recorded=compared, complete=recorded is not None,
                            from_shell=tuple(sorted(from_shell)), unset=tuple(sorted(unset)),
                            overridden=tuple(sorted(overrides)))


def _shown(value: str) -> str:
    text = redact_text(value)
    return repr(text if len(text) <= _SHOWN_VALUE else text[:_SHOWN_VALUE] + "...")


def env_differences(renv: RerunEnvironment, rerun_env: Mapping[str, str]) -> tuple[str, ...]:
    """Every variable whose value in the rerun differs from the recording, one phrase each
    (``TRIGGER: recorded '1', unset in the rerun``). Without a recording, the recorded determinism
    variables are compared instead."""
    recorded = renv.recorded
    ours = {k: v for k, v in rerun_env.items() if not k.startswith(_PER_ATTEMPT_PREFIX) and k != "PYTHONUNBUFFERED"}
    out: list[str] = []
    for name in sorted(set(recorded) | (set(ours) if renv.complete else set())):
        was, now = recorded.get(name), ours.get(name)
        if was == REDACTED:
            if name in renv.from_shell:
                out.append(f"{name}: redacted in the record, this shell's value used")
            elif now is None:
                out.append(f"{name}: redacted in the record, unset in the rerun")
            else:
                out.append(f"{name}: redacted in the record, set with --env")
        elif was == now:
            continue
        elif was is None:
            out.append(f"{name}: not recorded, {_shown(now or '')} in the rerun" if renv.complete
                       else f"{name}: unset when recorded, {_shown(now or '')} in the rerun")
        elif now is None:
            out.append(f"{name}: recorded {_shown(was)}, unset in the rerun")
        else:
            out.append(f"{name}: recorded {_shown(was)}, {_shown(now)} in the rerun")
    return tuple(out)
