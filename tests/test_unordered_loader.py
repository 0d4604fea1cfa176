"""in_order=False: batches reach the loop in the order workers finish them, and a resume
(at any num_workers, world size or batch size) trains every sample of the epoch exactly
once (G1 for in_order=False, G2), each with its own seed (G4)."""

from __future__ import annotations

import multiprocessing
import re
from collections import Counter

import pytest
import torch
import torch.distributed.checkpoint as dcp

from dist_resume import Mixture, ResumableDataLoader, save_checkpoint
from dist_resume.cli import main
from dist_resume.state.delivered import DELIVERED_KEY
from dist_resume.state.fields import ResumeStateError
from tests.datasets import Augmented, Indices, Squares
from tests.layout import committed_dir
from tests.merged_states import merged_from
from tests.unordered_datasets import Gated


def indices_of(batches) -> list[int]:
    return [int(i) for batch in batches for i in batch[0]]


def unpadded_indices(loader: ResumableDataLoader) -> list[int]:
    """The indices of a pass of `loader` (shuffle off: positions are indices) without the
    padding that its final batch repeats from the epoch's start (G2)."""
    padding = loader.padding_positions()
    indices = indices_of(loader)
    for position in padding:
        indices.remove(position)
    return indices


@pytest.mark.parametrize("workers_before, workers_after", [(0, 2), (2, 0), (2, 3)])
def test_in_order_false_resumes_every_sample_exactly_once(workers_before, workers_after):
    loader = ResumableDataLoader(Squares(50), batch_size=4, shuffle=True, seed=5, num_workers=workers_before,
                                 in_order=False)
    iterator = iter(loader)
    before = [next(iterator) for _ in range(5)]
    state = loader.state_dict()
    resumed = ResumableDataLoader(Squares(50), batch_size=4, shuffle=True, seed=5, num_workers=workers_after,
                                  in_order=False)
    resumed.load_state_dict(state)
    after = list(resumed)
    assert sorted(indices_of(before) + indices_of(after)) == list(range(50))
    assert resumed.epoch == 1  # the resumed pass ended the epoch


def gated_loader(gate, **kwargs) -> ResumableDataLoader:
    # Batch 0 (positions 0-3, shuffle off) holds sample 1, which waits for the gate.
    return ResumableDataLoader(Gated(24, {1}, gate), batch_size=4, num_workers=2, in_order=False, seed=9, **kwargs)


def test_a_straggler_is_overtaken_and_its_batch_is_not_lost():
    gate = multiprocessing.Event()
    loader = gated_loader(gate)
    iterator = iter(loader)
    first = next(iterator)  # worker 0 holds batch 0 until the gate opens: batch 1 arrives first
    gate.set()
    rest = list(iterator)
    order = [first[0].tolist()] + [batch[0].tolist() for batch in rest]
    assert order[0] == [4, 5, 6, 7]
    assert sorted(order) == [list(range(k, k + 4)) for k in range(0, 24, 4)]


def test_the_state_holds_the_prefix_and_the_batches_delivered_beyond_it():
    gate = multiprocessing.Event()
    loader = gated_loader(gate)
    iterator = iter(loader)
    assert next(iterator)[0].tolist() == [4, 5, 6, 7]
    state = loader.state_dict()
    gate.set()
    del iterator
    entry = state["rank_0"]
    progress = dict(zip(("batches", "samples"), entry["progress"][12:14].tolist()))
    assert progress == {"batches": 0, "samples": 0}  # batch 0 was not consumed: the prefix is empty
    assert entry[DELIVERED_KEY].tolist() == [2, 0]  # batches below 2 were delivered, except batch 0
    assert len(entry[DELIVERED_KEY]) * 8 <= 4096


@pytest.mark.parametrize("world_size, batch_size", [(1, 4), (1, 3), (3, 2)])
def test_a_resume_after_a_straggler_trains_what_was_not_delivered(world_size, batch_size):
    gate = multiprocessing.Event()
    loader = gated_loader(gate)
    iterator = iter(loader)
    first = next(iterator)
    state = loader.state_dict()
    gate.set()
    del iterator
    after = []
    for rank in range(world_size):
        resumed = ResumableDataLoader(Gated(24, set(), gate), batch_size=batch_size, in_order=False, seed=9,
                                      rank=rank, world_size=world_size, num_workers=1)
        resumed.load_state_dict(state)
        after += unpadded_indices(resumed)
    assert sorted(after) == [i for i in range(24) if i not in (4, 5, 6, 7)]


def test_two_ranks_with_stragglers_resume_at_three_ranks_exactly_once():
    gates = [multiprocessing.Event(), multiprocessing.Event()]
    loaders = [ResumableDataLoader(Gated(40, {rank * 4 + 1}, gates[rank]), batch_size=4, num_workers=2,
                                   in_order=False, seed=3, shuffle=False, rank=rank, world_size=2)
               for rank in range(2)]
    iterators = [iter(loader) for loader in loaders]
    delivered = [indices_of([next(iterator)]) for iterator in iterators]
    delivered[1] += indices_of([next(iterators[1])])
    state = merged_from(loaders)
    for gate in gates:
        gate.set()
    del iterators
    after = []
    for rank in range(3):
        resumed = ResumableDataLoader(Gated(40, set(), gates[0]), batch_size=2, in_order=False, seed=3,
                                      shuffle=False, rank=rank, world_size=3)
        resumed.load_state_dict(state, independent_ranks=True)  # rank 1 took a batch more
        after += unpadded_indices(resumed)
    counts = Counter(delivered[0] + delivered[1] + after)
    assert sorted(counts) == list(range(40)) and set(counts.values()) == {1}


def test_per_sample_randomness_follows_the_position_whatever_the_order():
    uninterrupted = {int(sample["index"][i]): float(sample["torch"][i])
                     for sample in ResumableDataLoader(Augmented(30), batch_size=3, shuffle=True, seed=2)
                     for i in range(len(sample["index"]))}
    loader = ResumableDataLoader(Augmented(30), batch_size=3, shuffle=True, seed=2, num_workers=2, in_order=False)
    iterator = iter(loader)
    batches = [next(iterator) for _ in range(4)]
    resumed = ResumableDataLoader(Augmented(30), batch_size=3, shuffle=True, seed=2, num_workers=3, in_order=False)
    resumed.load_state_dict(loader.state_dict())
    batches += list(resumed)
    seen = {int(batch["index"][i]): float(batch["torch"][i]) for batch in batches for i in range(len(batch["index"]))}
    assert seen == uninterrupted


def test_a_mixture_resumes_exactly_once_out_of_order():
    def mixture():
        return Mixture({"a": Indices(10), "b": Indices(6)}, {"a": 2, "b": 1}, length=24)

    def keys(batches):
        return [key for batch in batches for key in batch]

    loader = ResumableDataLoader(mixture(), batch_size=4, num_workers=2, in_order=False, seed=4, collate_fn=list)
    iterator = iter(loader)
    before = [next(iterator) for _ in range(3)]
    resumed = ResumableDataLoader(mixture(), batch_size=3, num_workers=2, in_order=False, seed=4, collate_fn=list)
    resumed.load_state_dict(loader.state_dict())
    reference = ResumableDataLoader(mixture(), batch_size=4, seed=4, collate_fn=list)
    assert Counter(keys(before) + keys(resumed)) == Counter(keys(reference))


def test_an_in_order_loader_resumes_an_out_of_order_state():
    gate = multiprocessing.Event()
    loader = gated_loader(gate)
    iterator = iter(loader)
    first = indices_of([next(iterator)])
    state = loader.state_dict()
    gate.set()
    del iterator
    resumed = ResumableDataLoader(Gated(24, set(), gate), batch_size=4, seed=9)
    resumed.load_state_dict(state)
    assert sorted(first + indices_of(resumed)) == list(range(24))


class Stateful(Squares):
    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


SUPPORTED = ("in_order=False is supported for map-style datasets and Mixtures in the loader's own order, and for "
             "IterableDatasets and Mixtures of streams; ")


@pytest.mark.parametrize(
    "dataset, kwargs, message",
    [
        (Squares(4), {"sampler": range(4)}, "this loader has a custom sampler or batch_sampler: use in_order=True"),
        (Squares(4), {"batch_sampler": [[0, 1]]},
         "this loader has a custom sampler or batch_sampler: use in_order=True"),
        (Stateful(4), {}, "this dataset has state_dict/load_state_dict (per-worker states need in_order=True)"),
    ],
)
def test_what_in_order_false_does_not_support_is_refused(dataset, kwargs, message):
    with pytest.raises(ValueError, match=f"^{re.escape(SUPPORTED + message)}$"):
        ResumableDataLoader(dataset, in_order=False, **kwargs)


@pytest.mark.parametrize(
    "values, message",
    [
        ([2], "loader state entry 'rank_0' is impossible: delivered [2] is not a frontier above ascending holes "
              "that start at its 0 consumed batches"),
        ([2, 1], "loader state entry 'rank_0' is impossible: delivered [2, 1] is not a frontier above ascending "
                 "holes that start at its 0 consumed batches"),
        ([3, 0, 0], "loader state entry 'rank_0' is impossible: delivered [3, 0, 0] is not a frontier above "
                    "ascending holes that start at its 0 consumed batches"),
        ([9, 0], "loader state of rank 0 is impossible: batch 8 delivered of an epoch that has 6"),
    ],
)
def test_an_impossible_delivered_entry_is_refused(values, message):
    loader = ResumableDataLoader(Squares(24), batch_size=4)
    state = loader.state_dict()
    state["rank_0"][DELIVERED_KEY] = torch.tensor(values, dtype=torch.int64)
    with pytest.raises(ResumeStateError, match=f"^{re.escape(message)}$"):
        ResumableDataLoader(Squares(24), batch_size=4).load_state_dict(state)


def test_inspect_shows_the_batches_delivered_beyond_the_prefix(tmp_path, capsys):
    gate = multiprocessing.Event()
    loader = gated_loader(gate)
    iterator = iter(loader)
    next(iterator)
    save_checkpoint({"loader": loader.state_dict()}, str(tmp_path / "ckpt"), 1)
    gate.set()
    del iterator
    assert main(["inspect", str(tmp_path / "ckpt")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2:] == ["  rank 0: epoch 0 (in progress), 0 batches = 0 samples consumed this epoch",
                          "    out of order: its batches up to 1 were consumed too, except 0"]


def test_plain_dcp_load_of_a_state_with_holes_names_the_entry_point(tmp_path):
    gate = multiprocessing.Event()
    loader = gated_loader(gate)
    iterator = iter(loader)
    next(iterator)
    save_checkpoint({"loader": loader}, str(tmp_path), 1)
    gate.set()
    del iterator
    fresh = gated_loader(gate)
    with pytest.raises(BaseException, match=re.escape(f"rank_0.{DELIVERED_KEY}")):  # DCP's CheckpointException
        dcp.load({"loader": fresh}, checkpoint_id=str(committed_dir(tmp_path, 1)))
    fresh.load_state_dict(loader.state_dict())  # the whole state: the holes are re-planned
    assert sorted(indices_of(fresh)) == [i for i in range(24) if i not in (4, 5, 6, 7)]


def test_persistent_workers_pinned_memory_and_single_samples_resume_out_of_order():
    loader = ResumableDataLoader(Indices(20), batch_size=3, num_workers=2, in_order=False, persistent_workers=True,
                                 pin_memory=True, shuffle=True, seed=1)
    assert sorted(int(i) for batch in loader for i in batch) == list(range(20))  # epoch 0, whole
    iterator = iter(loader)
    before = [int(i) for _ in range(3) for i in next(iterator)]
    loader.load_state_dict(loader.state_dict())  # the same workers serve the resume
    after = [int(i) for batch in loader for i in batch]
    assert sorted(before + after) == list(range(20)) and loader.epoch == 2
    single = ResumableDataLoader(Indices(10), batch_size=None, num_workers=2, in_order=False)
    assert sorted(int(sample) for sample in single) == list(range(10))


def test_a_mixtures_progress_counts_the_batches_delivered_beyond_the_prefix():
    mixture = Mixture({"a": Indices(10), "b": Indices(6)}, {"a": 2, "b": 1}, length=24)
    state = ResumableDataLoader(mixture, batch_size=4, in_order=False, seed=4).state_dict()
    state["rank_0"][DELIVERED_KEY] = torch.tensor([3, 0], dtype=torch.int64)  # batches 1 and 2 delivered
    assert mixture.progress(state) == mixture.progress(12) != mixture.progress(0)


def test_a_resume_of_holes_needs_every_ranks_state():
    gate = multiprocessing.Event()
    loader = gated_loader(gate, rank=0, world_size=2)
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()  # rank 0's entry only
    gate.set()
    del iterator
    message = ("loader state holds ranks [0] of a world of 2, ranks [1] are missing: resuming batches delivered "
               "out of order (in_order=False) at world size 2, batch size 4 (saved: world size 2, batch size 4) "
               "needs every rank's state (use dist_resume.load_checkpoint, or merge the state_dict() of every rank)")
    with pytest.raises(ResumeStateError, match=f"^{re.escape(message)}$"):
        gated_loader(gate, rank=0, world_size=2).load_state_dict(state)


def test_skip_while_batches_are_out_of_order_is_refused_and_in_order_it_is_exact():
    """skip() cannot pass over an epoch whose prefix has holes in flight. Without holes it
    skips from the prefix, and the next pass numbers its batches from there: no skipped
    batch is taken for a hole, none is trained twice."""
    gate = multiprocessing.Event()
    loader = gated_loader(gate)
    iterator = iter(loader)
    assert next(iterator)[0].tolist() == [4, 5, 6, 7]
    message = ("skip() cannot pass over batches while this pass delivered some out of order (in_order=False) "
               "beyond its consumed prefix (batches 0 are still in flight): skip between passes, or after "
               "load_state_dict / load_checkpoint")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        loader.skip(1)
    gate.set()
    del iterator
    gate = multiprocessing.Event()
    gate.set()
    loader = ResumableDataLoader(Gated(24, set(), gate), batch_size=4, num_workers=0, in_order=False, seed=9)
    iterator = iter(loader)
    assert next(iterator)[0].tolist() == [0, 1, 2, 3]
    assert loader.skip(2) == 2  # batches 1 and 2: samples 4-11
    iterator = iter(loader)
    assert [next(iterator)[0].tolist() for _ in range(3)] == [list(range(k, k + 4)) for k in (12, 16, 20)]
    assert loader.state_dict()["rank_0"][DELIVERED_KEY].tolist() == [6]  # no hole left behind
    assert list(iterator) == []
