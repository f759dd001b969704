"""The manifest add-on (a hook of ``supervisor/run/hooks.py``): each attempt's provenance
(``supervisor/addons/manifest.py``: git, the child's torch, the environment) written beside the event log.

The probes run on a thread per attempt, so they never delay a launch; the attempts that die at
start are the ones whose manifest matters most, so teardown lets them land (bounded). The run loop
never imports this module; ``supervisor/cli/run_cmd.py`` wires it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from .manifest import collect_manifest, write_manifest
from ..run.attempt import AttemptState
from ..run.context import RunContext
from ..run.hooks import AddOn

log = logging.getLogger("supervisor.run")

WAIT_AT_TEARDOWN_S = 25.0  # the provenance probes still running when the run ends
WAIT_AFTER_NOTICE_S = 1.0  # ... when a stop notice came: the grace deadline wins


class ManifestWriter(AddOn):
    """Writes ``manifest-N.json`` for each attempt N, on a background thread."""

    def __init__(self) -> None:
        self._threads: list[threading.Thread] = []

    def on_launch(self, ctx: RunContext, state: AttemptState, argv: Sequence[str]) -> None:
        attempt, argv = state.attempt, list(argv)

        def work() -> None:
            try:
                manifest = collect_manifest(attempt=attempt, argv=argv, config=ctx.cfg, environ=dict(ctx.environ),
                                            cwd=ctx.cwd, child_python=None, run_dir=ctx.layout.paths.run_dir)
                write_manifest(ctx.layout.paths.manifest(attempt), manifest)
            except Exception as exc:  # provenance is best effort, never fatal
                log.debug("manifest for attempt %d failed: %s", attempt, exc)

        thread = threading.Thread(target=work, daemon=True, name="manifest")
        thread.start()
        self._threads.append(thread)

    def at_teardown(self, noticed: bool) -> None:
        end = time.monotonic() + (WAIT_AFTER_NOTICE_S if noticed else WAIT_AT_TEARDOWN_S)
        for thread in self._threads:
            thread.join(max(end - time.monotonic(), 0.0))
