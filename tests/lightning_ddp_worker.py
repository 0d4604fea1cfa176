"""One process of a Lightning DDP job (run by torchrun from tests/test_lightning_ddp.py).

Usage: lightning_ddp_worker.py OUT_DIR BATCH_SIZE MAX_STEPS SAVE_TO|- RESUME_FROM|- [sampler|early]
Trains on `_Indices` with a LightningLoader built in train_dataloader() (`early`: built
before `fit`, as README says not to), records the indices of every trained batch to
OUT_DIR/rank_<r>.json, and saves a checkpoint at the end.
"""

from __future__ import annotations

import json
import os
import sys

import lightning.pytorch as pl
import torch

from dist_resume import ResumableDataLoader, shut_down_distributed
from dist_resume.integrations.lightning import LightningLoader

DATASET_SIZE = 64  # with a global batch of 12: 5 full steps and a partial one per epoch


class _Indices(torch.utils.data.Dataset):
    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float(index)])

    def __len__(self) -> int:
        return DATASET_SIZE


class _Recorder(pl.LightningModule):
    def __init__(self, batch_size: int, with_sampler: bool) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.batch_size = batch_size
        self.with_sampler = with_sampler
        self.trained: list[list[int]] = []

    def train_dataloader(self):
        return _loader(self.batch_size, self.with_sampler)

    def training_step(self, batch, batch_index):
        self.trained.append(batch[:, 0].long().tolist())
        return self.layer(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _loader(batch_size: int, with_sampler: bool) -> LightningLoader:
    sampler = torch.utils.data.SequentialSampler(_Indices()) if with_sampler else None
    return LightningLoader(ResumableDataLoader(_Indices(), batch_size=batch_size, shuffle=sampler is None,
                                               sampler=sampler, seed=0))


def main() -> None:
    out_dir, batch_size, max_steps, save_to, resume_from = sys.argv[1:6]
    option = sys.argv[6] if len(sys.argv) > 6 else None
    model = _Recorder(int(batch_size), with_sampler=option == "sampler")
    trainer = pl.Trainer(accelerator="cpu", strategy="ddp", devices=int(os.environ["LOCAL_WORLD_SIZE"]),
                         max_steps=int(max_steps), enable_progress_bar=False, logger=False,
                         enable_checkpointing=False, enable_model_summary=False, limit_val_batches=0,
                         default_root_dir=out_dir)
    early = _loader(int(batch_size), False) if option == "early" else None
    trainer.fit(model, train_dataloaders=early, ckpt_path=None if resume_from == "-" else resume_from)
    if save_to != "-":
        trainer.save_checkpoint(save_to)
    with open(os.path.join(out_dir, f"rank_{trainer.global_rank}.json"), "w") as file:
        json.dump(model.trained, file)
    # Lightning unwrapped its DDP model when fit ended; a group left to interpreter exit can
    # hang or abort in gloo's teardown (one rank died with SIGABRT in CI).
    shut_down_distributed()


if __name__ == "__main__":
    main()
