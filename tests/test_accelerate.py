"""Hugging Face accelerate with ResumableDataLoader (issue 10 point 6; G1-G3).

`dist_resume.integrations.accelerate.attach` keeps the loader through `prepare` and makes
`save_state`/`load_state` resume it exactly. The multi-process cases run real `torchrun`
jobs on CPU/gloo (tests/accelerate_worker.py) and compare, global step by global step, the
sets of samples trained with a single-process reference of the same global batch.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("accelerate")
from accelerate import Accelerator  # noqa: E402
from accelerate.data_loader import skip_first_batches  # noqa: E402

from dist_resume import ResumableDataLoader, ResumeStateError  # noqa: E402
from dist_resume.integrations.accelerate import attach  # noqa: E402

from .doc_blocks import blocks  # noqa: E402
from .process_tree import run_tree  # noqa: E402
from .s3_server import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GLOBAL_BATCH = 6
LENGTH = 48  # tests/accelerate_worker.py's dataset
EPOCHS = 2
SAVE_AT = 3  # global steps trained before the save, in epoch 0


class _Indices(torch.utils.data.Dataset):
    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(index)

    def __len__(self) -> int:
        return 40


def _take(loader, count: int | None = None) -> list[list[int]]:
    out = []
    for batch in loader:
        out.append(batch.tolist())
        if len(out) == count:
            break
    return out


@pytest.mark.parametrize("num_workers", [0, 2])
def test_prepare_keeps_the_loader_and_save_state_resumes_it_g1(tmp_path, num_workers):
    def fresh():
        accelerator = Accelerator(cpu=True)
        loader = ResumableDataLoader(_Indices(), batch_size=4, shuffle=True, seed=5, num_workers=num_workers)
        return accelerator, attach(accelerator, loader)

    _, reference = fresh()
    uninterrupted = _take(reference)
    accelerator, loader = fresh()
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    _, _, prepared = accelerator.prepare(model, optimizer, loader)
    assert prepared is loader
    head = _take(prepared, 3)
    accelerator.save_state(tmp_path / "ckpt")

    accelerator, loader = fresh()
    model, optimizer = torch.nn.Linear(1, 1), torch.optim.SGD(model.parameters(), lr=0.1)
    _, _, prepared = accelerator.prepare(model, optimizer, loader)
    accelerator.load_state(tmp_path / "ckpt")
    assert head + _take(prepared) == uninterrupted


def test_attach_refuses_a_loader_of_another_world_size():
    loader = ResumableDataLoader(_Indices(), batch_size=4, rank=1, world_size=2)
    with pytest.raises(ValueError, match=r"the loader shards over 2 rank\(s\) as rank 1, but this accelerate "
                                         r"process is 0 of 1; build the ResumableDataLoader after Accelerator\(\)"):
        attach(Accelerator(cpu=True), loader)


def test_attach_refuses_split_batches():
    from accelerate import DataLoaderConfiguration

    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(split_batches=True))
    with pytest.raises(ValueError, match=r"Accelerator\(split_batches=True\) is not supported"):
        attach(accelerator, ResumableDataLoader(_Indices(), batch_size=4))


def test_load_state_without_loader_states_is_an_error(tmp_path):
    accelerator = Accelerator(cpu=True)
    accelerator.save_state(tmp_path / "ckpt")  # nothing attached: no loader state saved
    attach(accelerator, ResumableDataLoader(_Indices(), batch_size=4))
    with pytest.raises(ResumeStateError, match="holds no state for attached loader 0"):
        accelerator.load_state(tmp_path / "ckpt")


# -- real multi-process jobs ----------------------------------------------------------


def _launch(processes: int, record: Path, *args: str) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={processes}",
               f"--master-port={free_port()}", "--master-addr=127.0.0.1",
               # As a module from the repository root: tests/datasets.py would shadow HF datasets.
               "-m", "tests.accelerate_worker",
               f"--batch-size={GLOBAL_BATCH // processes}", f"--epochs={EPOCHS}", f"--record={record}", *args]
    result = run_tree(command, timeout=240, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]


def _global_steps(record: Path, processes: int) -> list[tuple[int, frozenset[int]]]:
    ranks = [json.loads((record / f"rank_{rank}.json").read_text()) for rank in range(processes)]
    assert len({len(steps) for steps in ranks}) == 1, "ranks trained different numbers of steps"
    steps = []
    for per_rank in zip(*ranks):
        assert len({step[0] for step in per_rank}) == 1, "ranks trained different epochs in one step"
        steps.append((per_rank[0][0], frozenset(index for step in per_rank for index in step[1:])))
    return steps


def _reference() -> list[tuple[int, frozenset[int]]]:
    class Indices(torch.utils.data.Dataset):
        def __getitem__(self, index):
            return index

        def __len__(self):
            return LENGTH

    loader = ResumableDataLoader(Indices(), batch_size=GLOBAL_BATCH, shuffle=True, seed=0, rank=0, world_size=1)
    steps = []
    for epoch in range(EPOCHS):
        loader.set_epoch(epoch)
        steps += [(epoch, frozenset(batch.tolist())) for batch in loader]
    return steps


@pytest.fixture(scope="module")
def saved_at_two(tmp_path_factory) -> tuple[Path, list]:
    """A 2-process job that trains SAVE_AT global steps, saves accelerate's state and stops."""
    root = tmp_path_factory.mktemp("accelerate")
    _launch(2, root / "before", f"--save={root / 'ckpt'}", f"--save-at={SAVE_AT}")
    return root / "ckpt", _global_steps(root / "before", 2)


@pytest.mark.slow
@pytest.mark.parametrize("processes", [2, 1, 3])
def test_save_state_load_state_resume_exactly_at_any_world_size_g1_g3(saved_at_two, processes, tmp_path):
    checkpoint, before = saved_at_two
    assert len(before) == SAVE_AT
    _launch(processes, tmp_path / "after", f"--load={checkpoint}")
    assert before + _global_steps(tmp_path / "after", processes) == _reference()


REBUILT = (
    "ResumableDataLoader: its batches come from its own epoch order and position, not from its "
    "{what}: a DataLoader rebuilt from it (accelerate's prepare without attach, or its skip_first_batches; "
    "HF Trainer's mid-epoch resume) would train another order, silently. With accelerate, attach the loader "
    "(dist_resume.integrations.accelerate.attach) before prepare; resume it with load_state_dict; under HF "
    "Trainer, put dist_resume.integrations.transformers.ResumableTrainerMixin before Trainer (it turns "
    "Trainer's batch skipping off and saves the loader's state with each checkpoint)"
)


def test_plain_prepare_is_an_error_not_another_order():
    """Without attach, accelerate's prepare rebuilds the loader as its own DataLoaderShard
    from the loader's batch_sampler: another order on every rank, which it trained silently
    before; now iterating it raises with the recipe."""
    prepared = Accelerator().prepare(ResumableDataLoader(list(range(8)), batch_size=2, shuffle=True, seed=0))
    with pytest.raises(ValueError, match=f"^{re.escape(REBUILT.format(what='batch_sampler'))}$"):
        next(iter(prepared))


def test_save_state_into_a_directory_of_a_larger_job_drops_its_extra_ranks_g6(tmp_path):
    accelerator = Accelerator(cpu=True)
    loader = attach(accelerator, ResumableDataLoader(_Indices(), batch_size=4, shuffle=True, seed=5))
    head = _take(loader, 2)
    folder = tmp_path / "ckpt" / "dist_resume"
    folder.mkdir(parents=True)
    (folder / "loader_0_rank_1.json").write_text("left by a 2-process job")
    accelerator.save_state(tmp_path / "ckpt")
    assert sorted(path.name for path in folder.iterdir()) == ["loader_0_rank_0.json"]
    accelerator = Accelerator(cpu=True)
    resumed = attach(accelerator, ResumableDataLoader(_Indices(), batch_size=4, shuffle=True, seed=5))
    accelerator.load_state(tmp_path / "ckpt")
    assert head + _take(resumed) == _take(ResumableDataLoader(_Indices(), batch_size=4, shuffle=True, seed=5))


@pytest.mark.parametrize("rank", [0, 1])
def test_a_dataloader_rebuilt_from_its_samplers_is_an_error_not_another_order(rank):
    """skip_first_batches built a plain DataLoader from torch's default batch sampler, which
    the loader never iterates: another order than the loader trains, and the whole dataset
    on every rank (issue 23)."""
    loader = ResumableDataLoader(list(range(8)), batch_size=2, shuffle=True, seed=0, rank=rank, world_size=2)
    rebuilt = skip_first_batches(loader, 1)
    with pytest.raises(ValueError, match=f"^{re.escape(REBUILT.format(what='batch_sampler'))}$"):
        list(rebuilt)
    for what in ("batch_sampler", "sampler"):
        with pytest.raises(ValueError, match=f"^{re.escape(REBUILT.format(what=what))}$"):
            iter(getattr(loader, what))
    assert [len(batch) for batch in loader] == [2, 2]  # the loader itself is unaffected: its share of 8
    assert len(loader.batch_sampler) == 4 and len(loader.sampler) == 8  # torch's, unchanged


def test_a_user_sampler_stays_the_users():
    sampler = torch.utils.data.SequentialSampler(range(6))
    loader = ResumableDataLoader(list(range(6)), batch_size=2, sampler=sampler)
    assert loader.sampler is sampler and list(loader.batch_sampler) == [[0, 1], [2, 3], [4, 5]]


def test_a_copied_loader_serves_the_same_batches():
    """The guarded samplers stay copyable: copy.deepcopy of a loader (as frameworks do) hit
    endless recursion in the guard's attribute lookup."""
    loader = ResumableDataLoader(list(range(8)), batch_size=2, shuffle=True, seed=0)
    copied = copy.deepcopy(loader)
    assert [batch.tolist() for batch in copied] == [batch.tolist() for batch in loader]
    assert len(copied.batch_sampler) == 4


MIXED = (
    "accelerate checkpoint {folder}, loader 0: loader state entries come from different saves (ranks [0] at "
    "global step 4; ranks [1] at global step 3): a rank stopped between a training step and the save, or states "
    "of different saves were merged; resume from a checkpoint that every rank saved at one step (if the ranks do "
    "not train in lockstep, load with independent_ranks=True). save_state into one directory is not atomic "
    "across processes: save into a new directory each time (ProjectConfiguration(automatic_checkpoint_naming=True)) "
    "and resume from the newest one that every process completed"
)


@pytest.mark.slow
def test_files_of_two_save_states_are_refused_not_resumed(tmp_path):
    """Issue 23: a 2-process job saves after every step into one directory; at step 4 rank 1
    is gone between optimizer.step() and save_state, so rank 0's files say 4 steps and rank
    1's 3. The model holds step 4: resuming would train rank 1's batch 4 twice (and, at 3
    processes, hand samples out three times). The load is refused, naming both steps."""
    _launch(2, tmp_path / "record", f"--save={tmp_path / 'ckpt'}", "--save-at=4", "--save-every-step",
            "--killed-rank=1")
    accelerator = Accelerator(cpu=True)
    attach(accelerator, ResumableDataLoader(_Indices48(), batch_size=GLOBAL_BATCH, shuffle=True, seed=0))
    with pytest.raises(ResumeStateError, match=f"^{re.escape(MIXED.format(folder=tmp_path / 'ckpt'))}$"):
        accelerator.load_state(tmp_path / "ckpt")


class _Indices48(_Indices):
    def __len__(self) -> int:
        return LENGTH


@pytest.mark.slow
def test_the_docs_recipe_resumes_its_step_counter_with_the_loader(tmp_path):
    """Issue 32: docs/frameworks.md's accelerate recipe, as written, run twice in one folder
    (1 process, 16 steps of 8 over 2 epochs, saved at steps 5, 10 and 15). The second run
    resumes from step 15's checkpoint: one batch is left, and its counter must end at step 16.
    The recipe used to count from 0 again after `load_state` (it ended at step 1), so its
    saves after a resume fell on other steps than its `% 5` said."""
    [recipe] = [block for block in blocks(ROOT / "docs" / "frameworks.md") if "from accelerate import" in block.text]
    script = tmp_path / "recipe.py"
    script.write_text(recipe.text)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    outputs = [subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600) for _ in range(2)]
    for run in outputs:
        assert run.returncode == 0, run.stderr[-3000:]
    assert [run.stdout.splitlines()[-1] for run in outputs] == ["trained up to step 16"] * 2
