"""A nanoGPT-style training, unchanged in spirit: one checkpoint ``<out_dir>/ckpt.pt`` rewritten in
place, the step under ``iter_num``, resumed with ``--init_from=resume`` (the script knows where its
checkpoint is; it takes no path). ``CRASH_AT="1:25,2:37"`` dereferences NULL (a real SIGSEGV) after
that iteration in that attempt (``SUPERVISOR_ATTEMPT``)."""

import ctypes
import os
import sys

import torch

cfg = {"out_dir": "out", "init_from": "scratch", "max_iters": 50, "eval_interval": 10}
for arg in sys.argv[1:]:  # nanoGPT's configurator: --key=value
    key, _, value = arg.removeprefix("--").partition("=")
    cfg[key] = type(cfg[key])(value)
crash = dict(item.split(":") for item in os.environ.get("CRASH_AT", "").split(",") if item)
crash_at = int(crash.get(os.environ.get("SUPERVISOR_ATTEMPT", "1"), -1))

os.makedirs(cfg["out_dir"], exist_ok=True)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
iter_num = 0
if cfg["init_from"] == "resume":
    ckpt_path = os.path.join(cfg["out_dir"], "ckpt.pt")
    checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    iter_num = checkpoint["iter_num"]
    print(f"resuming from iter {iter_num}", flush=True)
while iter_num < cfg["max_iters"]:
    if iter_num % cfg["eval_interval"] == 0 and iter_num > 0:
        checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": iter_num,
                      "config": dict(cfg)}
        print(f"saving checkpoint to {cfg['out_dir']}", flush=True)
        torch.save(checkpoint, os.path.join(cfg["out_dir"], "ckpt.pt"))
    loss = model(torch.randn(8, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"iter {iter_num}: loss {loss.item():.4f}", flush=True)
    if iter_num == crash_at:
        ctypes.string_at(0)
    iter_num += 1
print("done", flush=True)
