"""One process of a transformers `Trainer` job (run as a module, directly or by
torchrun, from tests/test_transformers_trainer.py: run by its path, tests/datasets.py would
shadow Hugging Face's `datasets`).

Usage: python -m tests.transformers_worker OUT_DIR BATCH_SIZE MAX_STEPS SAVE_STEPS KILL_AT|- RESUME|- [plain]
[epochs=N]
Trains a model that records the sample indices of every batch it is given, on a
ResumableDataLoader returned by get_train_dataloader() (`plain`: a Trainer without
ResumableTrainerMixin, with ignore_data_skip=True, as a user would try), writes one line
per optimizer step to OUT_DIR/rank_<r>.jsonl, checkpoints every SAVE_STEPS steps into
OUT_DIR/checkpoints, and SIGKILLs itself at the end of step KILL_AT (before that step's
save, if any). RESUME: a checkpoint directory to resume from. `epochs=N`: train N epochs
(with MAX_STEPS -1, Trainer counts the run's steps from them).
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from dist_resume import ResumableDataLoader, end_with_launcher, shut_down_distributed
from dist_resume.integrations.transformers import ResumableTrainerMixin

DATASET_SIZE = 36
SEED = 3


class Indices(torch.utils.data.Dataset):
    def __getitem__(self, index: int) -> dict[str, int]:
        return {"index": index}

    def __len__(self) -> int:
        return DATASET_SIZE


class Recorder(torch.nn.Module):
    """Trains one weight; remembers the indices of the batches it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[int] = []

    def forward(self, index: torch.Tensor) -> dict[str, torch.Tensor]:
        self.seen.extend(index.tolist())
        return {"loss": (self.weight * index.float()).mean()}


class StepLog(TrainerCallback):
    """Writes each optimizer step's samples; kills the process at the end of step `kill_at`."""

    def __init__(self, path: str, model: Recorder, kill_at: int | None) -> None:
        self.path, self.model, self.kill_at = path, model, kill_at

    def on_step_end(self, args, state, control, **kwargs) -> None:
        with open(self.path, "a", encoding="utf-8") as file:
            file.write(json.dumps({"step": state.global_step, "samples": self.model.seen}) + "\n")
        self.model.seen = []
        if state.global_step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


def _loader(trainer: Trainer) -> ResumableDataLoader:
    return ResumableDataLoader(trainer.train_dataset, batch_size=trainer.args.per_device_train_batch_size,
                               shuffle=True, seed=SEED)


class PlainTrainer(Trainer):
    def get_train_dataloader(self) -> ResumableDataLoader:
        return _loader(self)


class ExactTrainer(ResumableTrainerMixin, Trainer):
    def get_train_dataloader(self) -> ResumableDataLoader:
        return _loader(self)


def build_trainer(out_dir: str, batch_size: int, max_steps: int, save_steps: int, kill_at: int | None = None,
                  trainer_type: type[Trainer] = ExactTrainer, **arguments: object) -> Trainer:
    """The job's trainer; `arguments`: more TrainingArguments."""
    arguments = TrainingArguments(**{
        "output_dir": os.path.join(out_dir, "checkpoints"), "per_device_train_batch_size": batch_size,
        "max_steps": max_steps, "save_strategy": "steps", "save_steps": save_steps, "logging_strategy": "no",
        "report_to": "none", "use_cpu": True, "disable_tqdm": True, "learning_rate": 0.01, "seed": 0, **arguments,
    })
    model = Recorder()
    trainer = trainer_type(model=model, args=arguments, train_dataset=Indices())
    trainer.add_callback(StepLog(os.path.join(out_dir, f"rank_{arguments.process_index}.jsonl"), model, kill_at))
    return trainer


def main(out_dir: str, batch_size: str, max_steps: str, save_steps: str, kill_at: str, resume: str,
         *flags: str) -> None:
    plain = "plain" in flags
    epochs = [float(flag.removeprefix("epochs=")) for flag in flags if flag.startswith("epochs=")]
    trainer = build_trainer(out_dir, int(batch_size), int(max_steps), int(save_steps),
                            None if kill_at == "-" else int(kill_at), PlainTrainer if plain else ExactTrainer,
                            ignore_data_skip=plain, **({"num_train_epochs": epochs[0]} if epochs else {}))
    trainer.train(resume_from_checkpoint=None if resume == "-" else resume)
    # shut_down_distributed needs nothing else to hold the group: the Trainer keeps the DDP
    # model, whose reducer holds the group's work (a 3-process run once hung at exit with it).
    del trainer
    gc.collect()
    shut_down_distributed()


if __name__ == "__main__":
    end_with_launcher()  # torchrun's workers live in sessions of their own: a killed launcher ends them
    main(*sys.argv[1:])
