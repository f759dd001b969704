"""FSDP2 with sharded DCP checkpoints, supervised: every rank writes its own shards, and a kill at any
moment of a save never leaves a checkpoint the next start could take for a whole one.

    supervise run -- torchrun --standalone --nproc-per-node 2 examples/train_fsdp.py --steps 100
    srun supervise run -- ...   # under Slurm (see sbatch_templates/); gloo on CPU, NCCL on GPUs

What changes compared with train_torchrun.py (DDP, rank 0 saves one file):
  * the model is sharded with ``fully_shard`` (FSDP2): no rank holds the whole state, so every rank
    saves its own part through ``torch.distributed.checkpoint`` (DCP);
  * ``supervisor.integrations.dcp.save(state, ckpt_dir / f"step-{N}", N)`` instead of ``dcp.save``:
    DCP writes into ``step-<N>.tmp-<attempt>-<nonce>/``, every rank fsyncs its files, the ranks meet
    at a barrier, rank 0 writes the commit marker (every rank's files and sizes) and renames the
    directory into place. The supervisor resumes only from a committed directory and removes or
    finishes cut-short ones at the next start. Rank 0 reports the save once every rank is done;
  * retention removes old step directories with ``sharded.discard`` (marker first, then a rename
    to a temp name, then the files): a kill while deleting never leaves half a checkpoint that
    looks whole;
  * resuming: ``dcp.load`` into the sharded state dict, then ``set_state_dict``.

Model, data and faults are train_plain.py's (``FAULT_RANK`` picks the rank a fault fires on, as in
train_torchrun.py). ``--save-seconds S`` makes every rank's part of a save take S seconds more (a
slow filesystem), ``--save-bytes`` pads each rank's shard.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_plain as plain

from supervisor import client, sharded
from supervisor.integrations import dcp as sdcp


def own_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--save-seconds", type=float, default=0.0, help="extra seconds per rank and save")
    return p.parse_known_args(argv)


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank when it is True on at least one: all ranks stop at the same step."""
    value = torch.tensor([1 if flag else 0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def shard_model(model: torch.nn.Module, mesh: Any) -> torch.nn.Module:
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def step_dirs(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """Committed ``step-<N>`` directories, oldest first."""
    found = []
    for path in ckpt_dir.glob("step-*"):
        number = path.name.removeprefix("step-")
        if number.isdigit() and sharded.verify_commit(path).committed:
            found.append((int(number), path))
    return sorted(found)


def prune(ckpt_dir: Path, keep: int, protect: set[str]) -> None:
    """Rank 0: keep the newest ``keep`` (at least two) committed step directories."""
    dirs = step_dirs(ckpt_dir)
    for _, path in dirs[: max(len(dirs) - max(keep, 2), 0)]:
        if str(path) not in protect:
            sharded.discard(path)


def main(argv: list[str] | None = None) -> int:
    extra, rest = own_args(argv)
    args = plain.parse_args(rest)
    client.install()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(args.device, local_rank) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if os.environ.get("FAULT_SIGTERM_PID") == "self":
        os.environ["FAULT_SIGTERM_PID"] = str(os.getpid())
    fault_rank = int(os.environ.get("FAULT_RANK", "0"))
    ckpt_dir = Path(args.ckpt_dir or client.checkpoint_dir() or "checkpoints")
    mesh = init_device_mesh(device.type, (world,))

    torch.manual_seed(args.seed)  # same initial weights on every rank, then sharded
    teacher = torch.randn(args.dim, 1, generator=torch.Generator().manual_seed(args.seed)).to(device)
    model = shard_model(plain.build_model(args, device), mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    def state_at(at: int) -> dict[str, Any]:
        model_state, optim_state = get_state_dict(model, optimizer)
        state: dict[str, Any] = {"model": model_state, "optim": optim_state, "step": at}
        if args.save_bytes:
            state[f"pad{rank}"] = torch.ones(args.save_bytes, dtype=torch.uint8)
        return state

    resume = args.ckpt or client.resume_path()
    step = 0
    if resume:
        state = state_at(0)
        dcp.load(state, checkpoint_id=resume)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        step = int(state["step"])
        if rank == 0:
            plain.say(f"resumed from {resume} at step {step}")
    client.resumed(step)
    last_saved = step if resume else -1

    def save(at: int) -> None:  # every rank: a collective
        nonlocal last_saved
        path = ckpt_dir / f"step-{at}"
        if extra.save_seconds:
            with sharded.saving_dir(at, path, rank=rank, world_size=world, barrier=dist.barrier,
                                    broadcast=sdcp.broadcast_str(), writer="dcp") as staging:
                dcp.save(state_at(at), checkpoint_id=staging)
                time.sleep(extra.save_seconds)  # a slow filesystem, on every rank
        else:
            sdcp.save(state_at(at), path, at)
        last_saved = at
        if rank == 0:
            prune(ckpt_dir, args.keep, {str(path), str(resume)})
            plain.say(f"saved step {at} to {path}")

    while step < args.steps:
        if any_rank(client.should_stop(), device):
            wanted = plain.emergency_save_wanted() if rank == 0 else False
            if last_saved != step and any_rank(wanted, device):
                save(step)
            reason = client.stop_reason() or "another rank was told to stop"
            plain.say(f"stopping at step {step} ({reason}) on rank {rank}")
            dist.destroy_process_group()
            return 0
        step += 1
        x, y = plain.batch_for(step * 1000 + rank, args, device, teacher)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # FSDP reduce-scatters the gradients here
        optimizer.step()
        client.heartbeat(step, loss=loss.detach())
        if rank == 0 and (step % args.log_every == 0 or step == args.steps):
            plain.say(f"step {step} loss {loss.item():.6f}")
        if rank == fault_rank:
            plain.inject_faults(step, device)
        if args.save_every and step % args.save_every == 0:
            save(step)
        if args.step_time:
            time.sleep(args.step_time)

    if args.save_every and last_saved != step:
        save(step)
    dist.barrier()
    client.done(step)
    if rank == 0:
        plain.say(f"training complete at step {step}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
    sys.exit(main())
