"""HF transformers' Trainer with ResumableTrainerMixin (issue 23 point 1): a job killed
mid-epoch and resumed with `trainer.train(resume_from_checkpoint=...)` trains every sample
exactly once, in the batches of an uninterrupted run, at the same world size and at another
(torchrun 2 -> 3). The model records the indices of every batch it trains (tests/transformers_worker.py)."""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from transformers import Trainer, TrainerCallback  # noqa: E402

from dist_resume import ResumableDataLoader, ResumeStateError, state_from_json, state_to_json  # noqa: E402
from tests.process_tree import run_tree  # noqa: E402
from tests.s3_server import free_port  # noqa: E402
from tests.transformers_worker import SEED, ExactTrainer, Indices, PlainTrainer, build_trainer  # noqa: E402

_REPO = Path(__file__).resolve().parent.parent


def _expected(batch_size: int, steps: int) -> list[list[int]]:
    """The batches an uninterrupted single-process run trains: the loader's own order."""
    loader = ResumableDataLoader(Indices(), batch_size=batch_size, shuffle=True, seed=SEED)
    batches: list[list[int]] = []
    while len(batches) < steps:
        batches.extend(batch["index"].tolist() for batch in loader)
    return batches[:steps]


def _trained(out_dir: Path) -> dict[int, list[int]]:
    """Each global step's samples, ranks merged; a step trained again after a resume counts
    as the resumed run trained it (its lines come later in each rank's file)."""
    steps: dict[int, list[int]] = collections.defaultdict(list)
    for path in sorted(out_dir.glob("rank_*.jsonl")):
        last = {}
        for line in path.read_text().splitlines():
            record = json.loads(line)
            last[record["step"]] = record["samples"]
        for step, samples in last.items():
            steps[step].extend(samples)
    return {step: steps[step] for step in sorted(steps)}


def _run(out_dir: Path, processes: int, *args: object) -> subprocess.CompletedProcess:
    out_dir.mkdir(exist_ok=True)
    launcher = [] if processes == 1 else [
        "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(processes),
        "--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    command = [sys.executable, *launcher, "-m", "tests.transformers_worker", str(out_dir), *map(str, args)]
    python_path = os.pathsep.join(filter(None, [str(_REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": python_path, "OMP_NUM_THREADS": "1"}
    return run_tree(command, timeout=300, env=env, cwd=_REPO)


@pytest.mark.slow
def test_trainer_killed_mid_epoch_resumes_on_the_exact_next_batch(tmp_path):
    """36 samples in batches of 4: 9 steps per epoch. Checkpoints at steps 6 and 12; SIGKILL
    at the end of step 8, inside epoch 0's rest; resumed from step 6 up to step 20."""
    killed = _run(tmp_path, 1, 4, 20, 6, 8, "-")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert max(_trained(tmp_path)) == 8
    resumed = _run(tmp_path, 1, 4, 20, 6, "-", tmp_path / "checkpoints" / "checkpoint-6")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    trained = _trained(tmp_path)
    assert list(trained) == list(range(1, 21))
    assert list(trained.values()) == _expected(4, 20)


@pytest.mark.slow
def test_trainer_ddp_killed_at_2_processes_resumes_exactly_at_3(tmp_path):
    """Global batch 12 on 36 samples (2 x 6, then 3 x 4): 3 steps per epoch. Checkpoints every
    2 steps; SIGKILL of both ranks at the end of step 5; resumed at 3 processes from step 4,
    inside epoch 1. Every global step trains the samples of the uninterrupted 2-process run."""
    killed = _run(tmp_path, 2, 6, 8, 2, 5, "-")
    assert killed.returncode != 0 and max(_trained(tmp_path)) == 5, killed.stderr[-3000:]
    resumed = _run(tmp_path, 3, 4, 8, 2, "-", tmp_path / "checkpoints" / "checkpoint-4")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    trained = _trained(tmp_path)
    ranks = [ResumableDataLoader(Indices(), batch_size=6, shuffle=True, seed=SEED, rank=rank, world_size=2)
             for rank in range(2)]
    uninterrupted = [sorted(a["index"].tolist() + b["index"].tolist())
                     for _ in range(3) for a, b in zip(*ranks)][:8]
    assert [sorted(samples) for samples in trained.values()] == uninterrupted
    for epoch in (range(1, 4), range(4, 7)):
        assert sorted(sample for step in epoch for sample in trained[step]) == list(range(36))


# -- in one process: the checks before the first batch ----------------------------------


def _train(out_dir: Path, max_steps: int, resume: Path | None = None, batch_size: int = 4, save_steps: int = 6,
           trainer_type: type[Trainer] = ExactTrainer, **arguments: object) -> Trainer:
    trainer = build_trainer(str(out_dir), batch_size, max_steps, save_steps, None, trainer_type, **arguments)
    trainer.train(resume_from_checkpoint=None if resume is None else str(resume))
    return trainer


def test_trainer_resumes_from_a_checkpoint_at_an_epochs_end(tmp_path):
    _train(tmp_path, 11, save_steps=9)
    _train(tmp_path, 14, tmp_path / "checkpoints" / "checkpoint-9")
    assert list(_trained(tmp_path).values()) == _expected(4, 14)


def test_trainer_saving_at_each_epochs_end_resumes_exactly(tmp_path):
    _train(tmp_path, 11, save_strategy="epoch")
    _train(tmp_path, 14, tmp_path / "checkpoints" / "checkpoint-9", save_strategy="epoch")
    assert list(_trained(tmp_path).values()) == _expected(4, 14)


def test_trainer_that_rebuilds_its_callbacks_from_the_checkpoint_resumes_exactly(tmp_path):
    """restore_callback_states_from_checkpoint=True: Trainer replaces the mixin's callback by
    one built from the checkpoint's entry, which must serve as well."""
    _train(tmp_path, 8)
    _train(tmp_path, 12, tmp_path / "checkpoints" / "checkpoint-6", restore_callback_states_from_checkpoint=True)
    assert list(_trained(tmp_path).values()) == _expected(4, 12)


def test_the_mixin_turns_off_trainers_batch_skipping(tmp_path):
    trainer = build_trainer(str(tmp_path), 4, 2, 6)
    assert trainer.args.ignore_data_skip is True


def test_plain_trainer_mid_epoch_resume_is_refused_by_the_loader(tmp_path):
    """Without the mixin, Trainer's skip_first_batches rebuilds a DataLoader from the loader's
    batch_sampler (another order): the loader refuses, naming the recipe."""
    _train(tmp_path, 6, trainer_type=PlainTrainer)
    with pytest.raises(ValueError, match="under HF Trainer, put dist_resume.integrations.transformers.ResumableTrainerMixin before Trainer"):
        _train(tmp_path, 8, tmp_path / "checkpoints" / "checkpoint-6", trainer_type=PlainTrainer)


class _DefaultLoader(ExactTrainer):
    get_train_dataloader = Trainer.get_train_dataloader


def test_a_trainer_whose_loader_is_not_resumable_is_refused(tmp_path):
    with pytest.raises(TypeError, match=r"get_train_dataloader\(\) returned a DataLoaderShard; return the "
                                        "ResumableDataLoader itself"):
        _train(tmp_path, 2, trainer_type=_DefaultLoader)


class _OtherShard(ExactTrainer):
    def get_train_dataloader(self) -> ResumableDataLoader:
        return ResumableDataLoader(self.train_dataset, batch_size=4, rank=1, world_size=2)


def test_a_loader_sharded_otherwise_than_the_trainers_processes_is_refused(tmp_path):
    with pytest.raises(ValueError, match="the loader shards over 2 rank\\(s\\) as rank 1, but this Trainer process is "
                                         "0 of 1"):
        _train(tmp_path, 2, trainer_type=_OtherShard)


def test_a_checkpoint_saved_without_the_mixin_is_refused(tmp_path):
    _train(tmp_path, 6, trainer_type=PlainTrainer)
    with pytest.raises(ResumeStateError, match=r"the checkpoint Trainer resumes \(global step 6\) holds no loader "
                                               "state: it was saved by a Trainer without ResumableTrainerMixin"):
        _train(tmp_path, 8, tmp_path / "checkpoints" / "checkpoint-6")


def test_a_resume_that_trainer_would_count_in_another_epoch_is_refused(tmp_path):
    """Saved at step 10 with batches of 4 (epoch 1 of 9 steps each); batches of 2 make 18
    steps per epoch, so Trainer would serve epoch 0 again: another global batch."""
    _train(tmp_path, 10, save_steps=10)
    with pytest.raises(ResumeStateError, match="^" + _global_batch_refused(10, (1, 4), (1, 2)) + "$"):
        _train(tmp_path, 12, tmp_path / "checkpoints" / "checkpoint-10", batch_size=2)


def _global_batch_refused(step: int, saved: tuple[int, int], now: tuple[int, int]) -> str:
    def described(processes: int, batch_size: int) -> str:
        return f"{processes * batch_size} samples per step ({processes} process{'es' * (processes > 1)} x {batch_size})"

    return re.escape(
        f"the checkpoint of global step {step} was saved at a global batch of {described(*saved)}; this Trainer "
        f"trains {described(*now)}: Trainer counts epochs and the end of the run in global steps, so at another "
        "global batch it would train samples twice or never. Resume with the global batch of the save (processes x "
        "per_device_train_batch_size)")


def test_a_resume_at_another_global_batch_in_the_same_epoch_is_refused(tmp_path):
    """Saved at step 4 with batches of 4 (16 of epoch 0's 36 samples). At batch size 6 Trainer
    counts 6 steps per epoch, still epoch 0, and would end a 2-epoch run at step 12, 4 steps
    into epoch 1: 12 of its samples never trained."""
    _train(tmp_path, 4, save_steps=4, num_train_epochs=2)
    with pytest.raises(ResumeStateError, match="^" + _global_batch_refused(4, (1, 4), (1, 6)) + "$"):
        _train(tmp_path, -1, tmp_path / "checkpoints" / "checkpoint-4", batch_size=6, save_steps=4,
               num_train_epochs=2)
    assert list(_trained(tmp_path)) == [1, 2, 3, 4]


@pytest.mark.slow
def test_trainer_ddp_saved_at_2_processes_is_refused_at_3_with_another_global_batch(tmp_path):
    """2 x 6 (12 per step, 3 steps per epoch) saved at step 1; 3 x 6 (18 per step) counts 2
    steps per epoch, still epoch 0, and would end a 2-epoch run at step 4, one step into
    epoch 1: 18 of its 36 samples never trained."""
    saved = _run(tmp_path, 2, 6, 1, 1, "-", "-", "epochs=2")
    assert saved.returncode == 0, saved.stderr[-3000:]
    resumed = _run(tmp_path, 3, 6, -1, 1, "-", tmp_path / "checkpoints" / "checkpoint-1", "epochs=2")
    assert resumed.returncode != 0
    message = _global_batch_refused(1, (2, 6), (3, 6))
    assert len(re.findall("ResumeStateError: " + message, resumed.stderr)) == 3, resumed.stderr[-5000:]
    assert list(_trained(tmp_path)) == [1]


def test_a_loader_state_of_another_step_is_refused(tmp_path):
    """checkpoint-2's loader state under checkpoint-4's global step 4: resumed, it would train
    steps 3 and 4's 8 samples twice."""
    _train(tmp_path, 4, save_steps=2)
    checkpoints = tmp_path / "checkpoints"
    entry = json.loads((checkpoints / "checkpoint-2" / "trainer_state.json").read_text())["stateful_callbacks"]
    state_file = checkpoints / "checkpoint-4" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state["stateful_callbacks"]["ResumableLoaderState"]["attributes"]["loader_state"] = \
        entry["ResumableLoaderState"]["attributes"]["loader_state"]
    state_file.write_text(json.dumps(state))
    with pytest.raises(ResumeStateError, match="^" + re.escape(
            "the checkpoint of global step 4 holds a loader state taken after 2 batches of the run, but Trainer's "
            "global step 4 stands after 4 (9 batches per epoch, gradient_accumulation_steps=1): the loader state "
            "comes from another step (trainer_state.json edited, or files of two checkpoints mixed), or "
            "gradient_accumulation_steps changed since the save; resume from a checkpoint as Trainer wrote it, with "
            "the gradient_accumulation_steps of the save") + "$"):
        _train(tmp_path, 8, checkpoints / "checkpoint-4", save_steps=2)
    assert list(_trained(tmp_path)) == [1, 2, 3, 4]


def test_another_gradient_accumulation_is_refused(tmp_path):
    """Saved at step 2 with gradient_accumulation_steps=3 (6 batches); at 1, Trainer's step 2
    stands after 2 batches."""
    _train(tmp_path, 2, save_steps=2, gradient_accumulation_steps=3)
    with pytest.raises(ResumeStateError, match="^" + re.escape(
            "the checkpoint of global step 2 holds a loader state taken after 6 batches of the run, but Trainer's "
            "global step 2 stands after 2 (9 batches per epoch, gradient_accumulation_steps=1)")):
        _train(tmp_path, 4, tmp_path / "checkpoints" / "checkpoint-2")


def test_a_mid_epoch_resume_with_gradient_accumulation_that_divides_the_epoch_is_exact(tmp_path):
    """9 batches per epoch, 3 per optimizer step; saved after 6 batches of epoch 0."""
    _train(tmp_path, 2, save_steps=2, gradient_accumulation_steps=3)
    _train(tmp_path, 6, tmp_path / "checkpoints" / "checkpoint-2", gradient_accumulation_steps=3)
    batches = _expected(4, 18)
    assert list(_trained(tmp_path).values()) == [sum(batches[i:i + 3], []) for i in range(0, 18, 3)]


def test_a_mid_epoch_resume_with_a_partial_last_accumulation_is_refused(tmp_path):
    _train(tmp_path, 2, save_steps=2, gradient_accumulation_steps=2)
    with pytest.raises(ResumeStateError, match="resuming inside epoch 0, whose 9 batches gradient_accumulation_steps"
                                               "=2 does not divide"):
        _train(tmp_path, 4, tmp_path / "checkpoints" / "checkpoint-2", gradient_accumulation_steps=2)


class _LateSave(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs) -> None:
        control.should_save = state.global_step == 3


def test_a_save_decided_after_the_mixins_callback_is_refused_at_resume(tmp_path):
    trainer = build_trainer(str(tmp_path), 4, 4, 100)
    trainer.add_callback(_LateSave())
    trainer.train()
    with pytest.raises(ResumeStateError, match="the checkpoint of global step 3 holds the loader state of no step: a "
                                               "callback set control.should_save after"):
        _train(tmp_path, 6, tmp_path / "checkpoints" / "checkpoint-3")


def test_every_checkpoint_holds_the_loaders_state_in_trainer_state_json(tmp_path):
    _train(tmp_path, 6)
    saved = json.loads((tmp_path / "checkpoints" / "checkpoint-6" / "trainer_state.json").read_text())
    entry = saved["stateful_callbacks"]["ResumableLoaderState"]["attributes"]
    loader = ResumableDataLoader(Indices(), batch_size=4, shuffle=True, seed=SEED)
    batches = iter(loader)
    for _ in range(6):
        next(batches)
    assert entry["global_step"] == 6
    assert state_to_json(state_from_json(json.dumps(entry["loader_state"]))) == state_to_json(loader.state_dict())
