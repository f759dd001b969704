"""Training-side determinism settings: make a run repeatable and record what was in effect.

Why: after a restart or requeue the post-mortem must be able to tell "the numbers changed because
the code or node changed" from "the numbers changed because nothing was pinned". :func:`apply` pins
the usual knobs and reports them through the client into the attempt's manifest; :func:`report`
only reads them. Runs in the training process (imports torch lazily), never in the supervisor.

    from supervisor import determinism
    determinism.apply(seed=1234)          # before the model and the first CUDA call
"""

from __future__ import annotations

import os
import random
import warnings
from typing import Any

CUBLAS_WORKSPACE = ":4096:8"  # NVIDIA's documented setting for deterministic cuBLAS reductions


def apply(seed: int | None = None, *, strict: bool = True) -> dict[str, Any]:
    """Pin determinism: ``CUBLAS_WORKSPACE_CONFIG``, ``torch.use_deterministic_algorithms(True,
    warn_only=not strict)``, cuDNN deterministic with benchmarking off, and (when ``seed`` is given)
    the Python, NumPy and torch seeds. Call it before the first CUDA operation: cuBLAS reads its
    workspace setting once. Returns the settings now in effect and reports them to the supervisor.
    """
    import torch

    cuda_was_ready = bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE
    torch.use_deterministic_algorithms(True, warn_only=not strict)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    if seed is not None:
        random.seed(seed)
        try:
            import numpy

            numpy.random.seed(seed % (2**32))
        except ImportError:
            pass
        torch.manual_seed(seed)  # seeds every CUDA device too
    if cuda_was_ready:
        warnings.warn("determinism.apply() ran after CUDA was initialised: CUBLAS_WORKSPACE_CONFIG may "
                      "not take effect for handles already created; call it at the top of the script",
                      RuntimeWarning, stacklevel=2)
    settings = report(send=False)
    settings["seed"] = seed
    settings["applied_after_cuda_init"] = cuda_was_ready
    _send(settings)
    return settings


def report(*, send: bool = True) -> dict[str, Any]:
    """The determinism settings in effect, unchanged; sent to the supervisor when ``send``."""
    settings: dict[str, Any] = {
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "pythonhashseed": os.environ.get("PYTHONHASHSEED"),
    }
    try:
        import torch
    except ImportError:
        settings["torch"] = None
        if send:
            _send(settings)
        return settings
    settings.update({
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    })
    try:
        settings["cudnn"] = torch.backends.cudnn.version()
    except Exception:  # noqa: BLE001 - no cuDNN in a CPU build
        settings["cudnn"] = None
    if send:
        _send(settings)
    return settings


def _send(settings: dict[str, Any]) -> None:
    try:
        from . import client

        client.report_determinism(**settings)
    except Exception:  # noqa: BLE001 - reporting must never break training
        pass
