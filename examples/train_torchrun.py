"""Several processes (torchrun / srun), supervised: what changes compared with train_plain.py.

    supervise run -- torchrun --standalone --nproc-per-node 2 examples/train_torchrun.py --steps 100
    srun supervise run -- ...   # under Slurm: one supervisor, the channel reaches every rank

  * every rank sends heartbeats (the supervisor sees which rank stalls);
  * only rank 0 writes checkpoints; the others wait for it at a barrier when it matters;
  * a stop notice may reach one rank only (a signal, a lost datagram): the stop flag is all-reduced
    every step so that ALL ranks stop at the SAME step. A rank that leaves alone would leave the
    others hanging in their next collective.

Model, data, checkpoints and faults are train_plain.py's. ``FAULT_RANK`` (default 0) picks the rank
a fault fires on; ``FAULT_SIGTERM_PID=self`` sends the notice to that rank only.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_plain as plain  # noqa: E402  (the single-process example, reused)

from supervisor import client  # noqa: E402


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank when it is True on at least one."""
    value = torch.tensor([1 if flag else 0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def main(argv: list[str] | None = None) -> int:
    args = plain.parse_args(argv)
    client.install()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(args.device, local_rank) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank()
    if os.environ.get("FAULT_SIGTERM_PID") == "self":
        os.environ["FAULT_SIGTERM_PID"] = str(os.getpid())
    fault_rank = int(os.environ.get("FAULT_RANK", "0"))
    ckpt_dir = Path(args.ckpt_dir or client.checkpoint_dir() or "checkpoints")
    if rank == 0:
        ckpt_dir.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(args.seed)  # same initial weights on every rank
    teacher = torch.randn(args.dim, 1, generator=torch.Generator().manual_seed(args.seed)).to(device)
    model = plain.build_model(args, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    resume = args.ckpt or client.resume_path()
    step = plain.load_checkpoint(resume, model, optimizer, device) if resume else 0
    if resume and rank == 0:
        plain.say(f"resumed from {resume} at step {step}")
    client.resumed(step)
    ddp = DistributedDataParallel(model)
    last_saved = step if resume else -1

    def save(at: int) -> None:  # rank 0 only
        nonlocal last_saved
        path = ckpt_dir / f"step={at}.ckpt"
        client.save(plain.checkpoint_state(model, optimizer, at, args.save_bytes), path, step=at)
        client.update_last(path, ckpt_dir / "last.ckpt")
        plain.prune(ckpt_dir, keep=args.keep, protect=[p for p in (path, resume) if p])
        last_saved = at
        plain.say(f"saved step {at} to {path}")

    while step < args.steps:
        if any_rank(client.should_stop(), device):  # the same answer on every rank, same step
            if rank == 0 and last_saved != step and plain.emergency_save_wanted():
                save(step)
            dist.barrier()  # nobody leaves before the checkpoint is on disk
            reason = client.stop_reason() or "another rank was told to stop"
            plain.say(f"stopping at step {step} ({reason}) on rank {rank}")
            dist.destroy_process_group()
            return 0
        step += 1
        # Each rank trains on its own shard of the synthetic data.
        x, y = plain.batch_for(step * 1000 + rank, args, device, teacher)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces the gradients here
        optimizer.step()
        client.heartbeat(step, loss=loss.detach())
        if rank == 0 and (step % args.log_every == 0 or step == args.steps):
            plain.say(f"step {step} loss {loss.item():.6f}")
        if rank == fault_rank:
            plain.inject_faults(step, device)
        if rank == 0 and args.save_every and step % args.save_every == 0:
            save(step)
        if args.step_time:
            time.sleep(args.step_time)

    if rank == 0 and last_saved != step:
        save(step)
    dist.barrier()
    client.done(step)
    if rank == 0:
        plain.say(f"training complete at step {step}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
