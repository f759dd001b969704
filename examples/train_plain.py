"""A plain PyTorch training loop that works with the supervisor. Copy the pattern into your script.

    supervise run -- python examples/train_plain.py --steps 200 --save-every 20
    python examples/train_plain.py --steps 20                 # also runs alone: the client is a no-op

What it shows, in order of appearance in ``main``:
  1. ``client.install()``: a SIGTERM (preemption notice) is recorded instead of killing us mid-save.
  2. Resume from the checkpoint the supervisor chose (``client.resume_path()``), or ``--ckpt``.
  3. ``client.heartbeat(step, loss=...)`` every step (cheap: the client throttles datagrams).
  4. Atomic step checkpoints ``step=<N>.ckpt`` (``client.save``), ``last.ckpt`` as a hard link
     (``client.update_last``), retention that always keeps at least two valid checkpoints.
  5. At a step boundary, when told to stop: save if the supervisor asks for it, then leave.

Printed lines are stable (tests and the zero-code step regex read them):
  ``step N loss X`` / ``resumed from <path> at step N`` / ``saved step N to <path>`` /
  ``stopping at step N (reason)`` / ``training complete at step N`` / ``throughput X steps/s ...``

Fault injection, to demonstrate every failure the supervisor handles. Each ``FAULT_*_AT=N`` fires
after step N, only in attempt ``FAULT_ATTEMPT`` (default 1; ``all`` = every attempt) so restarts
make progress:
  FAULT_SEGFAULT_AT         a real SIGSEGV (NULL read through ctypes)
  FAULT_ILLEGAL_MEMORY_AT   CUDA only: a real out-of-bounds GPU store, i.e.
                            "CUDA error: an illegal memory access was encountered"
  FAULT_STALL_AT            hang forever without printing
  FAULT_SIGTERM_AT          SIGTERM to $FAULT_SIGTERM_PID ("parent" = the supervisor), else to our
                            process group's leader: a simulated preemption notice
  FAULT_EXCEPTION_AT        an ordinary Python exception
  FAULT_RESTART_FROM_ZERO=1 ignore the resume point (the resume audit must catch it)
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import signal
import sys
import time
from pathlib import Path

import torch

from supervisor import client
from supervisor.checkpoints import prune

def say(line: str) -> None:
    """Print one line in one write: lines of several ranks sharing a pipe never interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# ----------------------------------------------------------------------------- fault injection


def fault_armed() -> bool:
    """Faults fire only in the chosen attempt, so that the restarted attempt gets past them."""
    wanted = os.environ.get("FAULT_ATTEMPT", "1").strip().lower()
    return wanted == "all" or (os.environ.get("SUPERVISOR_ATTEMPT") or "1") == wanted


def fault_at(name: str, step: int) -> bool:
    value = os.environ.get(name, "").strip()
    return value.isdigit() and int(value) == step and fault_armed()


def illegal_memory_access(device: torch.device) -> None:
    """Store far past the end of a real CUDA buffer. The kernel goes through the driver API with a
    tiny PTX program (no compiler needed); Triton is the fallback. The error is CUDA's own."""
    buffer = torch.zeros(1024, device=device)
    address = buffer.data_ptr() + (1 << 40)  # 1 TiB past the buffer: unmapped
    try:
        _ptx_store(address, device)
    except OSError as exc:  # no libcuda symbol, PTX JIT refused: try Triton
        say(f"FAULT_ILLEGAL_MEMORY_AT: driver-API launch unavailable ({exc}); trying Triton")
        _triton_store(buffer)
    torch.cuda.synchronize(device)  # raises "CUDA error: an illegal memory access was encountered"
    raise SystemExit("FAULT_ILLEGAL_MEMORY_AT: the out-of-bounds store did not fault")


_PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry oob_store(.param .u64 target)
{
    .reg .u64 %rd<2>;
    .reg .u32 %r<2>;
    ld.param.u64 %rd1, [target];
    mov.u32 %r1, 1;
    st.global.u32 [%rd1], %r1;
    ret;
}
"""


def _ptx_store(address: int, device: torch.device) -> None:
    libcuda = ctypes.CDLL("libcuda.so.1")  # already loaded by torch; its primary context is current
    void_p = ctypes.c_void_p

    def check(status: int, what: str) -> None:
        if status != 0:
            raise OSError(f"{what} returned CUDA driver status {status}")

    module, function = void_p(), void_p()
    check(libcuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(_PTX)), "cuModuleLoadData")
    check(libcuda.cuModuleGetFunction(ctypes.byref(function), module, b"oob_store"), "cuModuleGetFunction")
    target = ctypes.c_uint64(address)
    params = (void_p * 1)(ctypes.cast(ctypes.byref(target), void_p))
    libcuda.cuLaunchKernel.argtypes = [void_p] + [ctypes.c_uint] * 7 + [void_p, ctypes.POINTER(void_p), void_p]
    stream = void_p(torch.cuda.current_stream(device).cuda_stream)
    check(libcuda.cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, stream, params, None), "cuLaunchKernel")


def _triton_store(buffer: torch.Tensor) -> None:
    import triton
    import triton.language as tl

    @triton.jit
    def oob_store(ptr):
        tl.store(ptr + (1 << 38), 1.0)  # 1 TiB past the buffer (float32 elements)

    oob_store[(1,)](buffer)


def inject_faults(step: int, device: torch.device) -> None:
    if fault_at("FAULT_SEGFAULT_AT", step):
        say(f"FAULT_SEGFAULT_AT: segfault at step {step}")
        ctypes.string_at(0)  # SIGSEGV: no Python code can catch it
    if fault_at("FAULT_ILLEGAL_MEMORY_AT", step):
        if device.type == "cuda":
            say(f"FAULT_ILLEGAL_MEMORY_AT: out-of-bounds GPU store at step {step}")
            illegal_memory_access(device)
        else:
            say(f"FAULT_ILLEGAL_MEMORY_AT: skipped at step {step}: needs --device cuda")
    if fault_at("FAULT_STALL_AT", step):
        say(f"FAULT_STALL_AT: hanging at step {step}")
        while True:  # like a deadlocked collective: no output, signals recorded but not acted on
            time.sleep(3600)
    if fault_at("FAULT_SIGTERM_AT", step):
        target = os.environ.get("FAULT_SIGTERM_PID", "").strip()
        pid = os.getppid() if target == "parent" else int(target) if target else os.getpgrp()
        say(f"FAULT_SIGTERM_AT: SIGTERM to pid {pid} at step {step}")
        os.kill(pid, signal.SIGTERM)
    if fault_at("FAULT_EXCEPTION_AT", step):
        raise RuntimeError(f"FAULT_EXCEPTION_AT: injected exception at step {step}")


# ----------------------------------------------------------------------------- model and data


def build_model(args: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    layers: list[torch.nn.Module] = [torch.nn.Linear(args.dim, args.hidden), torch.nn.GELU()]
    for _ in range(args.layers - 1):
        layers += [torch.nn.Linear(args.hidden, args.hidden), torch.nn.GELU()]
    layers.append(torch.nn.Linear(args.hidden, 1))
    return torch.nn.Sequential(*layers).to(device)


def batch_for(step: int, args: argparse.Namespace, device: torch.device, teacher: torch.Tensor):
    """Synthetic data that depends only on the step: a resumed run sees exactly the same batches."""
    gen = torch.Generator(device=device).manual_seed(args.seed * 1_000_003 + step)
    x = torch.randn(args.batch, args.dim, generator=gen, device=device)
    return x, torch.tanh(x @ teacher)


# ----------------------------------------------------------------------------- checkpoints


def checkpoint_state(model, optimizer, step: int, pad_bytes: int) -> dict:
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": step,
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
    }
    if torch.cuda.is_initialized():
        state["rng"]["cuda"] = torch.cuda.get_rng_state_all()
    if pad_bytes > 0:  # makes saves take measurable time (preemption-during-save tests)
        state["pad"] = torch.ones(pad_bytes, dtype=torch.uint8)
    return state


def load_checkpoint(path: str, model, optimizer, device: torch.device) -> int:
    state = torch.load(path, map_location=device, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    rng = state.get("rng", {})
    if "torch" in rng:
        torch.set_rng_state(rng["torch"].cpu())
    if "python" in rng:
        random.setstate(_as_tuple(rng["python"]))
    if "cuda" in rng and device.type == "cuda":
        torch.cuda.set_rng_state_all([s.cpu() for s in rng["cuda"]])
    return int(state["step"])


def _as_tuple(value):
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


def emergency_save_wanted() -> bool:
    """Save before leaving? With a supervisor, it decides: the save must fit before the grace
    deadline (``save_requested()`` waits up to a second for that verdict, since Slurm's SIGTERM reaches
    us and the supervisor at the same moment). Alone: always save."""
    return client.save_requested() if client.enabled() else True


# ----------------------------------------------------------------------------- training


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Tiny MLP on synthetic data, supervised.")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--save-every", type=int, default=10, help="0 = never save (benchmarks)")
    p.add_argument("--keep", type=int, default=3, help="step checkpoints kept (never fewer than 2)")
    p.add_argument("--step-time", type=float, default=0.0, help="sleep per step, seconds")
    p.add_argument("--save-bytes", type=int, default=0, help="pad each checkpoint with this many bytes")
    p.add_argument("--ckpt-dir", default=None, help="[$SUPERVISOR_CHECKPOINT_DIR or ./checkpoints]")
    p.add_argument("--ckpt", default=None, help="resume from this checkpoint [the supervisor's choice]")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="bf16 = autocast")
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=1, help="print 'step N loss X' every N steps")
    p.add_argument("--warmup", type=int, default=10, help="steps left out of the throughput figure")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    client.install()  # SIGTERM is recorded, never kills us in the middle of a save
    device = torch.device(args.device)
    ckpt_dir = Path(args.ckpt_dir or client.checkpoint_dir() or "checkpoints")
    ckpt_dir.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(args.seed)
    teacher = torch.randn(args.dim, 1, generator=torch.Generator().manual_seed(args.seed)).to(device)
    model = build_model(args, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    resume = args.ckpt or client.resume_path()
    if os.environ.get("FAULT_RESTART_FROM_ZERO") == "1" and fault_armed():
        say(f"FAULT_RESTART_FROM_ZERO: ignoring resume point {resume}")
        resume = None
    step = 0
    if resume:
        step = load_checkpoint(resume, model, optimizer, device)
        say(f"resumed from {resume} at step {step}")
    client.resumed(step)

    last_saved = step if resume else -1
    first_step = step

    def save(at: int) -> None:
        nonlocal last_saved
        path = ckpt_dir / f"step={at}.ckpt"
        client.save(checkpoint_state(model, optimizer, at, args.save_bytes), path, step=at)
        client.update_last(path, ckpt_dir / "last.ckpt")  # hard link: never torn, never a symlink
        prune(ckpt_dir, keep=args.keep, protect=[p for p in (path, resume) if p])
        last_saved = at
        say(f"saved step {at} to {path}")

    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.dtype == "bf16")
    timed_from, timed_start = None, 0.0
    while step < args.steps:
        if client.should_stop():  # only at a step boundary: the state is consistent here
            if last_saved != step and emergency_save_wanted():
                save(step)
            say(f"stopping at step {step} ({client.stop_reason() or 'stop requested'})")
            return 0
        step += 1
        x, y = batch_for(step, args, device, teacher)
        with autocast:
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        client.heartbeat(step, loss=loss.detach())  # converted only when a datagram goes out
        if step % args.log_every == 0 or step == args.steps:
            say(f"step {step} loss {loss.item():.6f}")
        inject_faults(step, device)
        if args.save_every and step % args.save_every == 0:
            save(step)
        if args.step_time:
            time.sleep(args.step_time)
        if timed_from is None and step >= first_step + args.warmup:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            timed_from, timed_start = step, time.perf_counter()

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if timed_from is not None and step > timed_from:
        rate = (step - timed_from) / (time.perf_counter() - timed_start)
        say(f"throughput {rate:.3f} steps/s over steps {timed_from}..{step}")
    if args.save_every and last_saved != step:
        save(step)  # the final state
    client.done(step)  # training is complete: the exit that follows is not a preemption stop
    say(f"training complete at step {step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
