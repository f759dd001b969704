"""A training written the way nanoGPT's train.py is: module-level config overridden by
``--key=value`` arguments, data in ``data/<dataset>/{train,val}.bin`` (uint16 tokens), ONE checkpoint
``<out_dir>/ckpt.pt`` overwritten in place at every evaluation, its step under ``iter_num``, and a
resume flag without a path (``--init_from=resume``: the script knows where its checkpoint is).

Our own code (no upstream file is copied into this repository); it keeps the upstream conventions
the supervisor has to cope with: the checkpoint layout and keys, the log lines, the flags.
"""

import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

out_dir = "out"
eval_interval = 10
eval_iters = 2
always_save_checkpoint = True
init_from = "scratch"  # or "resume"
dataset = "tiny"
batch_size = 4
block_size = 16
n_layer = 1
n_head = 2
n_embd = 32
learning_rate = 1e-3
max_iters = 300
seed = 1337

# configurator: --key=value overrides the globals above, with the type of their default
for arg in sys.argv[1:]:
    key, _, value = arg.removeprefix("--").partition("=")
    if key not in globals():
        raise ValueError(f"Unknown config key: {key}")
    default = globals()[key]
    globals()[key] = (value.lower() == "true") if isinstance(default, bool) else type(default)(value)
    print(f"Overriding: {key} = {globals()[key]}")
config = {k: v for k, v in dict(globals()).items()
          if not k.startswith("_") and isinstance(v, (int, float, bool, str))}

torch.manual_seed(seed)
data_dir = os.path.join("data", dataset)


def get_batch(split):
    data = np.memmap(os.path.join(data_dir, f"{split}.bin"), dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64)) for i in ix])
    return x, y


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        layer = nn.TransformerEncoderLayer(n_embd, n_head, 4 * n_embd, dropout=0.0, batch_first=True)
        self.h = nn.TransformerEncoder(layer, n_layer)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, targets):
        t = idx.size(1)
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        x = self.h(self.wte(idx) + self.wpe(torch.arange(t)), mask=mask, is_causal=True)
        logits = self.lm_head(x)
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


iter_num = 0
best_val_loss = 1e9
model_args = dict(vocab_size=256, block_size=block_size, n_layer=n_layer, n_head=n_head, n_embd=n_embd)
if init_from == "scratch":
    print("Initializing a new model from scratch")
    model = GPT(**model_args)
elif init_from == "resume":
    print(f"Resuming training from {out_dir}")
    checkpoint = torch.load(os.path.join(out_dir, "ckpt.pt"), map_location="cpu")
    model_args = checkpoint["model_args"]
    model = GPT(**model_args)
    model.load_state_dict(checkpoint["model"])
    iter_num = checkpoint["iter_num"]
    best_val_loss = checkpoint["best_val_loss"]
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
if init_from == "resume":
    optimizer.load_state_dict(checkpoint["optimizer"])
    checkpoint = None


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            losses[k] = model(*get_batch(split))[1].item()
        out[split] = losses.mean()
    model.train()
    return out


X, Y = get_batch("train")
t0 = time.time()
while True:
    if iter_num % eval_interval == 0:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        if losses["val"] < best_val_loss or always_save_checkpoint:
            best_val_loss = losses["val"]
            if iter_num > 0:
                checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                              "model_args": model_args, "iter_num": iter_num,
                              "best_val_loss": best_val_loss, "config": config}
                print(f"saving checkpoint to {out_dir}")
                os.makedirs(out_dir, exist_ok=True)
                torch.save(checkpoint, os.path.join(out_dir, "ckpt.pt"))
    logits, loss = model(X, Y)
    X, Y = get_batch("train")
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    t1 = time.time()
    dt, t0 = t1 - t0, t1
    print(f"iter {iter_num}: loss {loss.item():.4f}, time {dt * 1000:.2f}ms", flush=True)
    iter_num += 1
    if iter_num > max_iters:
        break
