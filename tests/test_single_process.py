"""At num_workers=0 the loader fetches its batches itself (dist_resume.single_process): what
torch's single-process iterator does for a user stays the same."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from dist_resume import ResumableDataLoader

from .datasets import Squares

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
