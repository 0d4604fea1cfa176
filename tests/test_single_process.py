"""At num_workers=0 the loader fetches its batches itself (dist_resume.single_process): what
torch's single-process iterator does for a user stays the same."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, dataloader

from dist_resume import ResumableDataLoader
from dist_resume.streams import JsonlReader, ShardedStream

from .datasets import Squares
from .stream_jobs import write_shards

_SCOPE = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def _scopes(loader: DataLoader) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        for _ in loader:
            pass
    return sum(event.name == _SCOPE for event in profile.events())


def test_a_profile_holds_the_same_scopes_as_under_torch():
    dataset = Squares(10)
    # One per batch, and one for the call that ends the pass.
    assert _scopes(DataLoader(dataset, batch_size=4)) == 4
    assert _scopes(ResumableDataLoader(dataset, batch_size=4, seed=0)) == 4


def test_an_epoch_leaves_the_callers_generator_where_torch_leaves_it():
    dataset = Squares(10)
    after = []
    for loader in (DataLoader(dataset, batch_size=4), ResumableDataLoader(dataset, batch_size=4, seed=0)):
        torch.manual_seed(0)
        for _ in loader:
            pass
        after.append(torch.rand(4))
    assert torch.equal(after[0], after[1])


def test_a_streams_profile_holds_the_same_scopes_and_its_batches_skip_torchs_iterator(tmp_path, monkeypatch):
    stream = ShardedStream(write_shards(str(tmp_path)), JsonlReader(), canonical_streams=2)
    batches = len(ResumableDataLoader(stream, batch_size=8, seed=0))
    assert _scopes(ResumableDataLoader(stream, batch_size=8, seed=0)) == batches + 1  # as torch: and the end
    made = []
    real = dataloader._SingleProcessDataLoaderIter.__init__
    monkeypatch.setattr(dataloader._SingleProcessDataLoaderIter, "__init__",
                        lambda self, inner: made.append(inner) or real(self, inner))
    assert sum(1 for _ in ResumableDataLoader(stream, batch_size=8, seed=0)) == batches and made == []


def test_a_streams_epoch_leaves_the_callers_generator_where_torch_leaves_it(tmp_path):
    urls = write_shards(str(tmp_path))
    after = []
    for loader in (DataLoader(ShardedStream(urls, JsonlReader()), batch_size=4),
                   ResumableDataLoader(ShardedStream(urls, JsonlReader()), batch_size=4, seed=0)):
        loader.dataset.lengths()
        torch.manual_seed(0)
        for _ in loader:
            pass
        after.append(torch.rand(4))
    assert torch.equal(after[0], after[1])
