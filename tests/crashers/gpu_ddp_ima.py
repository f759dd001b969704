"""Two ranks under torchrun with NCCL: rank 1 hits a real illegal memory access at step 5 while
rank 0 waits in an all-reduce. The first failure is rank 1's; what rank 0 and torchrun print after
it (watchdog timeouts, aborts, the ChildFailedError summary) are consequences. Needs 2 GPUs."""
import datetime
import os

import torch
import torch.distributed as dist
import triton
import triton.language as tl


@triton.jit
def wild_store(ptr, offset):
    tl.store(ptr + offset, 1.0)


rank = int(os.environ["RANK"])
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=20),
                        device_id=torch.device("cuda", int(os.environ["LOCAL_RANK"])))
grad = torch.ones(1 << 20, device="cuda")
for step in range(1, 9):
    if rank == 1 and step == 5:
        wild_store[(1,)](grad, 1 << 42)
    dist.all_reduce(grad)
    torch.cuda.synchronize()
    print(f"global_step={step} loss={1.0 / step:.4f}", flush=True)
dist.destroy_process_group()
