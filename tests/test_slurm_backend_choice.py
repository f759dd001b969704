"""Which Slurm backend ``auto`` picks and why (supervisor/slurm/choice.py), and that run_start says so."""

from __future__ import annotations

import types

from supervisor.run.loop import _backend_fields
from supervisor.run.seams import BackgroundSlurm
from supervisor.slurm import BackendChoice, SlurmVersion, choose_backend, get_backend

V22, V24 = SlurmVersion(22, 5, 8), SlurmVersion(24, 11, 5)


def test_auto_uses_pyslurm_only_when_it_imports_and_matches_the_controller() -> None:
    assert choose_backend("auto", None, SlurmVersion(22, 5, 0), V22).name == "pyslurm"
    mismatch = choose_backend("auto", None, V22, V24)
    assert mismatch.name == "cli" and "built for Slurm 22.05" in mismatch.reason and "24.11.5" in mismatch.reason
    missing = choose_backend("auto", "import pyslurm failed (ImportError: libslurm.so.42)", None, None)
    assert missing.name == "cli" and "libslurm.so.42" in missing.reason
    silent = choose_backend("auto", None, V22, None, "Unable to contact slurm controller")
    assert silent.name == "cli" and "Unable to contact" in silent.reason
    assert choose_backend("auto", None, None, V22).name == "cli"
    assert choose_backend("cli", None, V22, V22).name == "cli"
    assert choose_backend("pyslurm", None, V22, V24).name == "pyslurm"  # forced: the person asked for it


def test_the_cli_is_chosen_with_the_import_error_when_pyslurm_does_not_import() -> None:
    def broken(name: str) -> types.ModuleType:
        raise ImportError("libslurm.so.38: cannot open shared object file")

    chosen = get_backend(importer=broken)
    assert chosen.name == "cli" and "libslurm.so.38" in chosen.choice.reason  # type: ignore[attr-defined]


def test_run_start_names_the_backend_and_why_and_a_local_run_names_none() -> None:
    backend = types.SimpleNamespace(choice=BackendChoice("pyslurm", "pyslurm built for Slurm 24.11 matches"))
    fields = _backend_fields(BackgroundSlurm("7", lambda: backend))
    assert fields == {"slurm_backend": "pyslurm", "slurm_backend_reason": "pyslurm built for Slurm 24.11 matches"}
    made: list[int] = []
    assert _backend_fields(BackgroundSlurm(None, lambda: made.append(1))) == {}
    assert made == []  # a local run never makes a backend


def test_a_pyslurm_whose_import_would_end_the_process_is_not_imported(tmp_path, monkeypatch) -> None:
    """libslurm exits the process when pyslurm is imported without a slurm.conf (the real 22.05
    build does): the supervisor tries the import in a child first and keeps the CLI."""
    package = tmp_path / "pyslurm"
    package.mkdir()
    (package / "__init__.py").write_text(
        "import sys\nprint('python3: fatal: Could not establish a configuration source', file=sys.stderr)\n"
        "sys.stderr.flush()\nimport os\nos._exit(1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    chosen = get_backend()
    assert chosen.name == "cli"
    assert "ends the process" in chosen.choice.reason  # type: ignore[attr-defined]
    assert "Could not establish a configuration source" in chosen.choice.reason  # type: ignore[attr-defined]


def test_a_pyslurm_record_without_a_time_limit_has_no_end_ahead_as_scontrol_shows_it() -> None:
    from supervisor.slurm.pyslurm_backend import job_info_from_pyslurm

    pending = types.SimpleNamespace(id=5, state="PENDING", time_limit=None, end_time=6091154903)
    assert job_info_from_pyslurm(pending, now=1_800_000_000).end_time is None  # the controller's placeholder
    limited = types.SimpleNamespace(id=5, state="RUNNING", time_limit=60, end_time=1_800_003_600)
    assert job_info_from_pyslurm(limited, now=1_800_000_000).end_time == 1_800_003_600.0
    ended = types.SimpleNamespace(id=5, state="COMPLETED", time_limit=None, end_time=1_700_000_000)
    assert job_info_from_pyslurm(ended, now=1_800_000_000).end_time == 1_700_000_000.0
