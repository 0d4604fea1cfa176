"""One process of an accelerate training job over ResumableDataLoader (tests/test_accelerate.py).

Records, per global step it trains, the dataset indices of its batch to RECORD/rank_R.json.
With --save-at K it saves accelerate's state after K steps and stops there (as if killed);
with --save-every-step also after each step before, into the same directory, and with
--killed-rank R rank R skips the last of those saves (as if killed between optimizer.step()
and save_state); with --load DIR it resumes from DIR first.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from accelerate import Accelerator

from dist_resume import ResumableDataLoader, shut_down_distributed
from dist_resume.integrations.accelerate import attach

LENGTH = 48


class Indices(torch.utils.data.Dataset):
    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(index)

    def __len__(self) -> int:
        return LENGTH


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--record", required=True)
    parser.add_argument("--save", help="accelerate checkpoint directory to save into")
    parser.add_argument("--save-at", type=int, default=0)
    parser.add_argument("--save-every-step", action="store_true")
    parser.add_argument("--killed-rank", type=int, default=-1)
    parser.add_argument("--load", help="accelerate checkpoint directory to resume from")
    args = parser.parse_args()

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = ResumableDataLoader(Indices(), batch_size=args.batch_size, shuffle=True, seed=0)
    attach(accelerator, loader)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if args.load:
        accelerator.load_state(args.load)
    trained: list[list[int]] = []
    for epoch in range(getattr(loader, "epoch", 0), args.epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            trained.append([epoch, *batch.tolist()])
            loss = model(batch.float().unsqueeze(1)).sum()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            last = len(trained) == args.save_at
            if args.save and (last or args.save_every_step):
                if not (last and accelerator.process_index == args.killed_rank):
                    accelerator.save_state(args.save)
            if last:
                break
        else:
            continue
        break
    os.makedirs(args.record, exist_ok=True)
    with open(os.path.join(args.record, f"rank_{accelerator.process_index}.json"), "w") as file:
        json.dump(trained, file)
    accelerator.wait_for_everyone()
    # The prepared (DDP) model holds the group: drop it, then leave the group before exit,
    # where gloo's teardown can hang (one rank stayed idle at exit after its record).
    del model, optimizer
    accelerator.free_memory()
    if torch.distributed.is_initialized():
        shut_down_distributed()
    accelerator.end_training()


if __name__ == "__main__":
    main()
