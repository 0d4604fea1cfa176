"""PyTorch Lightning's Trainer with ResumableDataLoader (issue 10 point 5, G1).

Real Trainer on CPU. Lightning saves `loader.state_dict()` in its checkpoint's fit loop
state; the checkpoint must resume on the exact next trained sample.
"""

from __future__ import annotations

import pytest
import torch

lightning = pytest.importorskip("lightning")
import lightning.pytorch as pl  # noqa: E402

from dist_resume import ResumableDataLoader, ResumeStateError  # noqa: E402
from dist_resume.integrations.lightning import LightningLoader  # noqa: E402


class _Sized(torch.utils.data.Dataset):
    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float(index)])

    def __len__(self) -> int:
        return 64


class _Stream(torch.utils.data.IterableDataset):
    """No __len__: Lightning then fetches one batch ahead of the one it trains."""

    def __iter__(self):
        return (torch.tensor([float(index)]) for index in range(64))


class _Recorder(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.trained: list[list[int]] = []

    def training_step(self, batch, batch_index):
        self.trained.append(batch[:, 0].long().tolist())
        return self.layer(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _fit(loader, max_steps: int, ckpt_path=None, tmp_path=None):
    model = _Recorder()
    trainer = pl.Trainer(accelerator="cpu", max_steps=max_steps, enable_progress_bar=False,
                         logger=False, enable_checkpointing=False, enable_model_summary=False,
                         limit_val_batches=0, default_root_dir=tmp_path)
    trainer.fit(model, train_dataloaders=loader, ckpt_path=ckpt_path)
    return trainer, model.trained


@pytest.mark.parametrize(
    "dataset",
    [_Sized, _Stream],
    ids=["with_len", "without_len"],
)
def test_lightning_checkpoint_resumes_on_next_trained_sample_g1(dataset, tmp_path):
    def loader():
        return LightningLoader(ResumableDataLoader(dataset(), batch_size=4, shuffle=False, seed=0))

    _, uninterrupted = _fit(loader(), max_steps=16, tmp_path=tmp_path)
    trainer, head = _fit(loader(), max_steps=7, tmp_path=tmp_path)
    path = tmp_path / "mid.ckpt"
    trainer.save_checkpoint(path)
    _, tail = _fit(loader(), max_steps=16, ckpt_path=path, tmp_path=tmp_path)
    assert head + tail == uninterrupted


class _SizedForty(_Sized):
    def __len__(self) -> int:
        return 40


class _StreamForty(torch.utils.data.IterableDataset):
    def __iter__(self):
        return (torch.tensor([float(index)]) for index in range(40))


@pytest.mark.slow
@pytest.mark.parametrize("dataset", [_SizedForty, _StreamForty], ids=["with_len", "without_len"])
def test_lightning_checkpoints_of_every_step_resume_exactly_across_epochs_g1(dataset, tmp_path):
    """ModelCheckpoint saves in on_train_batch_end, while Lightning holds the next batch
    (without __len__); 10 steps per epoch: resumes before, at and after the epoch's end."""

    def loader():
        shuffle = None if dataset is _StreamForty else True
        return LightningLoader(ResumableDataLoader(dataset(), batch_size=4, shuffle=shuffle, seed=0))

    every_step = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, filename="{step}", every_n_train_steps=1,
                                              save_top_k=-1, save_on_train_epoch_end=False)
    model = _Recorder()
    pl.Trainer(accelerator="cpu", max_steps=22, enable_progress_bar=False, logger=False, callbacks=[every_step],
               enable_model_summary=False, limit_val_batches=0, default_root_dir=tmp_path).fit(model, loader())
    uninterrupted = model.trained
    for step in (1, 9, 10, 11, 20):
        _, tail = _fit(loader(), max_steps=22, ckpt_path=tmp_path / f"step={step}.ckpt", tmp_path=tmp_path)
        assert uninterrupted[:step] + tail == uninterrupted, step


def test_lightning_resume_with_another_global_batch_is_refused(tmp_path):
    def loader(batch_size):
        return LightningLoader(ResumableDataLoader(_Sized(), batch_size=batch_size, shuffle=True, seed=0))

    trainer, _ = _fit(loader(4), max_steps=3, tmp_path=tmp_path)
    trainer.save_checkpoint(tmp_path / "mid.ckpt")
    with pytest.raises(ResumeStateError, match="under Lightning, keep the global batch when resuming"):
        _fit(loader(8), max_steps=6, ckpt_path=tmp_path / "mid.ckpt", tmp_path=tmp_path)


def test_lightning_loader_wraps_only_a_resumable_loader():
    with pytest.raises(TypeError, match="LightningLoader wraps a ResumableDataLoader, got DataLoader"):
        LightningLoader(torch.utils.data.DataLoader(_Sized()))


def test_dist_resume_imports_without_lightning():
    import subprocess
    import sys

    code = "import sys, dist_resume; assert 'lightning' not in sys.modules and 'pytorch_lightning' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
