"""What MACE's own training command line (``mace_run_train``) needs to run offline on a CPU in seconds,
made locally: ``train.xyz``, a few dozen random small molecules of H, C and O written with ase in the
extended XYZ format MACE reads, each with the energy and forces of ase's Lennard-Jones calculator
under MACE's default keys (``REF_energy``, ``REF_forces``).

Nothing here is MACE's code: the script the suite runs is the installed package's
``mace/cli/run_train.py``, unchanged (``train_script`` checks its SHA-256), run as ``python -m
mace.cli.run_train`` (what the ``mace_run_train`` command runs). ``make`` imports ase from ``SITE``:
the suite runs this file in a subprocess, once per session (conftest.py's ``tiny_mace``).

Usage: python mace_setup.py WORKDIR
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

MOLECULES = 40  # MACE keeps 20 % for validation (--valid_fraction 0.2): 32 to train, 8 steps of 4 an epoch
# MACE evaluates and saves after every epoch (--eval_interval 1 --save_all_checkpoints); the output
# names only epochs, so an epoch is the step of this stack and its save interval is 1.
EPOCHS = 12
NAME, SEED = "tiny", 1
CHECKPOINT_DIR = "checkpoints"  # MACE's default --checkpoints_dir, in the working directory
# MACE's checkpoint handler writes checkpoints/<name>_run-<seed>_epoch-<N>.pt (mace/tools/checkpoint.py).
CHECKPOINT_PREFIX = f"{NAME}_run-{SEED}_epoch-"

# The public script the MACE stack runs: its training command line as the pinned mace-torch wheel ships
# it (SOURCES.md).
MACE_PIN = "mace-torch==0.3.16"
TRAIN_SHA256 = "4f219fce454279b54cb7a10af30e8e8508cb7b83b3ffa6981ed89dbe7dc8de8b"
# mace-torch and what it imports that the test extra does not bring, in a directory of their own that
# only its child puts on its path (SOURCES.md says why). .ci/run installs it.
SITE = Path(os.environ.get("REALWORLD_MACE_SITE") or Path.home() / ".cache" / "slurm-supervisor" / "mace-0.3.16")
PACKAGES = ("mace-torch==0.3.16 e3nn==0.4.4 opt-einsum==3.4.0 opt-einsum-fx==0.1.4 ase==3.29.0 torch-ema==0.3 "
            "prettytable==3.19.0 matscipy==1.3.1 h5py==3.16.0 python-hostlist==2.3.0 configargparse==1.9.0 "
            "lmdb==3.0.0")
INSTALL = f"pip install --no-deps --upgrade --target {SITE} {PACKAGES}"

# The smallest MACE that trains in about 0.05 s a step on one thread: 8 channels, scalars only, one
# interaction, correlation order 2.
MODEL_FLAGS = ("--model", "MACE", "--num_channels", "8", "--max_L", "0", "--r_max", "3.0", "--num_radial_basis", "4",
               "--radial_MLP", "[8]", "--MLP_irreps", "4x0e", "--correlation", "2", "--num_interactions", "1")


def installed() -> bool:
    return (SITE / "mace" / "__init__.py").is_file()


def train_script() -> Path:
    """``mace/cli/run_train.py`` in ``SITE``, checked byte for byte against the pinned one."""
    import hashlib

    script = SITE / "mace" / "cli" / "run_train.py"
    assert script.is_file(), f"mace-torch is not installed: {INSTALL}"
    digest = hashlib.sha256(script.read_bytes()).hexdigest()
    assert digest == TRAIN_SHA256, f"{script} is not the pinned script (sha256 {digest}): {INSTALL}"
    return script


def train_command(python: str, epochs: int = EPOCHS) -> list[str]:
    """MACE's training command line with ``SITE`` on its path, on ``train.xyz`` in the working directory:
    the CPU, fp32, an evaluation and a save after every epoch, every save kept, no early stop."""
    train_script()
    return ["env", f"PYTHONPATH={SITE}", python, "-m", "mace.cli.run_train", "--name", NAME, "--seed", str(SEED),
            "--train_file", "train.xyz", "--valid_fraction", "0.2", "--E0s", "average", *MODEL_FLAGS,
            "--batch_size", "4", "--valid_batch_size", "8", "--max_num_epochs", str(epochs), "--eval_interval", "1",
            "--save_all_checkpoints", "--patience", "1000", "--device", "cpu", "--default_dtype", "float32"]


def write_molecules(path: Path) -> None:
    import numpy as np
    from ase import Atoms
    from ase.calculators.lj import LennardJones
    from ase.io import write

    rng = np.random.default_rng(0)
    frames = []
    for _ in range(MOLECULES):
        n = int(rng.integers(3, 6))
        while True:  # no two atoms closer than 0.9 A
            positions = rng.uniform(0, 2.5, (n, 3))
            distances = np.linalg.norm(positions[:, None] - positions[None], axis=-1) + np.eye(n) * 9
            if distances.min() > 0.9:
                break
        atoms = Atoms(symbols=list(rng.choice(["H", "C", "O"], n)), positions=positions)
        atoms.calc = LennardJones(sigma=1.0, epsilon=0.1, rc=3.0)
        energy, forces = atoms.get_potential_energy(), atoms.get_forces()
        atoms.calc = None
        atoms.info["REF_energy"] = energy
        atoms.arrays["REF_forces"] = forces
        frames.append(atoms)
    write(str(path), frames, format="extxyz")


def make(workdir: Path) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    write_molecules(workdir / "train.xyz")


if __name__ == "__main__":
    sys.path.insert(0, str(SITE))
    make(Path(sys.argv[1]))
