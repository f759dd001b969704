"""A real device-side assert: an out-of-bounds index on the GPU (IndexKernel.cu). Needs CUDA."""
import torch

table = torch.randn(10, 4, device="cuda")
index = torch.tensor([3, 12], device="cuda")  # 12 is out of bounds
for step in range(1, 4):
    print(f"step {step} loss {1.0 / step:.3f}", flush=True)
rows = table[index]
torch.cuda.synchronize()
print(rows.sum().item())
