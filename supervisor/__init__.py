"""slurm-supervisor: keep a long PyTorch training alive and honest on a shared Slurm cluster.

The supervisor process never imports torch: importing this package must stay cheap and must not
touch CUDA. Training code talks to the supervisor through :mod:`supervisor.client` (stdlib only).
"""

__version__ = "0.1.0"
