"""A real CUDA out-of-memory: ask for far more than the GPU holds. Needs CUDA."""
import torch

print("global_step=7", flush=True)
free, total = torch.cuda.mem_get_info()
too_much = torch.empty(int(total * 2) // 4, dtype=torch.float32, device="cuda")
print(too_much.shape)
