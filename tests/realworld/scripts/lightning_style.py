"""A Lightning training as its docs show it: a ``Trainer`` with a ``ModelCheckpoint`` that saves every
``--every_n_train_steps`` steps (``epoch=E-step=S.ckpt``, the newest ``--save_top_k`` kept, plus
``last.ckpt``) and ``trainer.fit(..., ckpt_path=--ckpt_path)`` to resume; the plain progress bar
Lightning's docs suggest for batch logs (``TQDMProgressBar``). The model is Lightning's own demo class, the data random
(one epoch holds the whole run, so the bar's count is the global step).

Our own code (no upstream file is copied into this repository), using Lightning's real API.
"""

import argparse

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.demos.boring_classes import DemoModel, RandomDataset
from torch.utils.data import DataLoader


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--default_root_dir", default="out")
    parser.add_argument("--max_steps", type=int, default=300)
    parser.add_argument("--every_n_train_steps", type=int, default=20)
    parser.add_argument("--ckpt_path", default=None)
    args = parser.parse_args()

    L.seed_everything(0)
    checkpoint = ModelCheckpoint(dirpath=f"{args.default_root_dir}/checkpoints",
                                 every_n_train_steps=args.every_n_train_steps, save_top_k=3, monitor="step", mode="max",
                                 save_last=True, verbose=True)
    trainer = L.Trainer(default_root_dir=args.default_root_dir, max_steps=args.max_steps,
                        callbacks=[checkpoint, TQDMProgressBar(refresh_rate=1)],
                        accelerator="cpu", devices=1, logger=False, log_every_n_steps=1,
                        enable_model_summary=False)
    data = DataLoader(RandomDataset(32, 4 * args.max_steps), batch_size=4)
    trainer.fit(DemoModel(), train_dataloaders=data, ckpt_path=args.ckpt_path)


if __name__ == "__main__":
    main()
