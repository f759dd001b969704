"""A real illegal memory access: a Triton kernel stores through a wild pointer. Needs CUDA and Triton."""
import torch
import triton
import triton.language as tl


@triton.jit
def wild_store(ptr, offset):
    tl.store(ptr + offset, 1.0)


x = torch.zeros(16, device="cuda")
for step in range(39, 42):
    print(f"global_step={step}", flush=True)
wild_store[(1,)](x, 1 << 42)  # 16 TiB past the buffer: unmapped
torch.cuda.synchronize()
print(x.sum().item())
