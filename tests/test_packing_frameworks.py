"""Packed sequences under the frameworks (issue 34 point 4), single-process runs on CPU:
HF transformers' Trainer with ResumableTrainerMixin, PyTorch Lightning with LightningLoader
and accelerate with `attach` each resume a packed stream mid-epoch on the exact next
sequence, with `collate_packed`'s batches; Lightning also with token files. Under Lightning
DDP a stream (packed or not) is refused when iteration starts: Lightning checkpoints rank
0's state only, which a stream's other ranks cannot be rebuilt from (TokenSequences, a
map-style dataset, can)."""

from __future__ import annotations

from pathlib import Path

import numpy
import pytest
import torch

from dist_resume import LightningLoader, ResumableDataLoader, ResumeStateError
from dist_resume.integrations.transformers import ResumableTrainerMixin
from dist_resume.packing import TokenSequences, collate_packed
from tests.packing_data import packed_stream, write_documents

STEPS, STOP = 12, 5


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_documents(str(tmp_path_factory.mktemp("documents")))


def packed_loader(urls: list[str]) -> ResumableDataLoader:
    return ResumableDataLoader(packed_stream(urls), batch_size=2, collate_fn=collate_packed)


class Recorder(torch.nn.Module):
    """One weight; remembers the token rows of every batch it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[list[int]] = []

    def forward(self, tokens, inputs, targets, position_ids, cu_seqlens, max_seqlen, num_tokens):
        assert inputs.shape == targets.shape == position_ids.shape and cu_seqlens.dtype == torch.int32
        self.seen.extend(tokens.tolist())
        return {"loss": (self.weight * inputs.float()).mean()}


def test_transformers_trainer_resumes_a_packed_stream_on_the_next_sequence(urls, tmp_path):
    transformers = pytest.importorskip("transformers")

    class PackedTrainer(ResumableTrainerMixin, transformers.Trainer):
        def get_train_dataloader(self) -> ResumableDataLoader:
            return packed_loader(urls)

    def train(out: Path, max_steps: int, resume: str | None = None, save_steps: int | None = None) -> list:
        arguments = transformers.TrainingArguments(
            output_dir=str(out), per_device_train_batch_size=2, max_steps=max_steps,
            save_strategy="steps" if save_steps else "no", save_steps=save_steps or 1, logging_strategy="no",
            report_to="none", use_cpu=True, disable_tqdm=True, learning_rate=0.01, seed=0)
        model = Recorder()
        trainer = PackedTrainer(model=model, args=arguments, train_dataset=packed_stream(urls))
        trainer.train(resume_from_checkpoint=resume)
        return model.seen

    uninterrupted = train(tmp_path / "whole", STEPS)
    head = train(tmp_path / "run", STOP, save_steps=STOP)
    tail = train(tmp_path / "run", STEPS, resume=str(tmp_path / "run" / f"checkpoint-{STOP}"))
    assert len(uninterrupted) == 2 * STEPS
    assert head + tail == uninterrupted


def test_accelerate_resumes_a_packed_stream_on_the_next_sequence(urls, tmp_path):
    accelerate = pytest.importorskip("accelerate")
    from dist_resume.integrations.accelerate import attach

    def fresh():
        accelerator = accelerate.Accelerator(cpu=True)
        loader = attach(accelerator, packed_loader(urls))
        model = torch.nn.Linear(1, 1)
        _, _, prepared = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
        assert prepared is loader
        return accelerator, prepared

    uninterrupted = [batch["tokens"].tolist() for batch in fresh()[1]]
    accelerator, loader = fresh()
    head = [batch["tokens"].tolist() for _, batch in zip(range(STOP), loader)]
    accelerator.save_state(tmp_path / "ckpt")
    accelerator, loader = fresh()
    accelerator.load_state(tmp_path / "ckpt")
    assert head + [batch["tokens"].tolist() for batch in loader] == uninterrupted


def lightning_fit(loader, max_steps: int, tmp_path: Path, ckpt_path=None):
    pl = pytest.importorskip("lightning.pytorch")

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.trained: list[list[int]] = []

        def training_step(self, batch, batch_index):
            self.trained.extend(batch["tokens"].tolist())
            return self.layer(batch["inputs"][:, :1].float()).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    model = Module()
    trainer = pl.Trainer(accelerator="cpu", max_steps=max_steps, enable_progress_bar=False, logger=False,
                         enable_checkpointing=False, enable_model_summary=False, limit_val_batches=0,
                         default_root_dir=tmp_path)
    trainer.fit(model, train_dataloaders=loader, ckpt_path=ckpt_path)
    return trainer, model.trained


@pytest.mark.parametrize("source", ["packed stream", "token files"])
def test_lightning_resumes_packed_sequences_on_the_next_one(urls, tmp_path, source):
    if source == "token files":
        path = tmp_path / "tokens.npy"
        numpy.save(path, numpy.arange(500, dtype=numpy.int64))

        def loader():
            return LightningLoader(ResumableDataLoader(TokenSequences([str(path)], 11), batch_size=2, shuffle=True,
                                                       seed=1, collate_fn=collate_packed))
    else:
        def loader():
            return LightningLoader(packed_loader(urls))

    _, uninterrupted = lightning_fit(loader(), STEPS, tmp_path)
    trainer, head = lightning_fit(loader(), STOP, tmp_path)
    trainer.save_checkpoint(tmp_path / "mid.ckpt")
    _, tail = lightning_fit(loader(), STEPS, tmp_path, ckpt_path=tmp_path / "mid.ckpt")
    assert len(uninterrupted) == 2 * STEPS
    assert head + tail == uninterrupted


def test_lightning_under_ddp_refuses_a_packed_stream_before_training(urls):
    loader = LightningLoader(ResumableDataLoader(packed_stream(urls), batch_size=2, rank=0, world_size=2,
                                                 collate_fn=collate_packed))
    with pytest.raises(ResumeStateError, match="^Lightning checkpoints the loader state of rank 0 only"):
        iter(loader)
