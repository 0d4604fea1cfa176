"""A worker's batch reaches the main process unchanged, its small tensors sent by value
(dist_resume/workers/by_value.py): the same values, dtypes, shapes, strides, offsets and
shared storages; larger tensors, and kinds it does not rebuild, go torch's way."""

from __future__ import annotations

from multiprocessing.reduction import ForkingPickler

import numpy
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import Dataset

from dist_resume import ResumableDataLoader
from dist_resume.workers.by_value import SMALL_STORAGE_BYTES, ByValueCollate
from tests.stream_jobs import make_stream, write_shards


def _sent(batch):
    """`batch` as a worker's ByValueCollate sends it and the main process receives it."""
    return ForkingPickler.loads(ForkingPickler.dumps(ByValueCollate(lambda samples: samples)(batch)))


def _assert_same(received: torch.Tensor, sent: torch.Tensor) -> None:
    assert type(received) is type(sent)
    assert (received.dtype, received.shape, received.stride(), received.storage_offset()) == (
        sent.dtype, sent.shape, sent.stride(), sent.storage_offset())
    assert received.untyped_storage().nbytes() == sent.untyped_storage().nbytes()
    assert torch.equal(received, sent)


def test_small_tensors_arrive_as_they_were_sent_and_views_of_one_storage_still_share_it():
    base = torch.arange(12, dtype=torch.float64)
    batch = {"view": base[2:8].view(2, 3), "base": base, "transposed": torch.arange(12).view(3, 4).t(),
             "empty": torch.empty(0, 5), "scalar": torch.tensor(True), "bf16": torch.arange(4, dtype=torch.bfloat16),
             "complex": torch.tensor([1 + 2j, 3 - 1j]), "other": [7, "x", None]}
    received = _sent(batch)
    assert received["other"] == [7, "x", None]
    for key, tensor in batch.items():
        if key != "other":
            _assert_same(received[key], tensor)
            assert not received[key].is_shared(), key
    assert received["view"].untyped_storage().data_ptr() == received["base"].untyped_storage().data_ptr()
    received["base"][3] = 100.0
    assert received["view"][0, 1] == 100.0


def test_a_tensor_whose_storage_is_over_the_limit_goes_through_shared_memory():
    large = torch.arange(SMALL_STORAGE_BYTES // 4 + 1, dtype=torch.float32)
    edge = torch.arange(SMALL_STORAGE_BYTES // 4, dtype=torch.float32)
    small_view_of_large = large[:3]
    received = _sent([large, edge, small_view_of_large])
    for got, sent in zip(received, [large, edge, small_view_of_large]):
        _assert_same(got, sent)
    assert [got.is_shared() for got in received] == [True, False, True]


@pytest.mark.filterwarnings("ignore:Sparse invariant checks")  # torch's, when it rebuilds the sparse one
def test_kinds_it_does_not_rebuild_arrive_as_torchs_own_way_brings_them():
    kinds = [torch.ones(3, requires_grad=True), torch.nn.Parameter(torch.ones(2)),
             torch.zeros(SMALL_STORAGE_BYTES + 1, dtype=torch.uint8), torch.eye(3).to_sparse()]
    received = _sent(kinds)
    for got, sent in zip(received, kinds):
        torchs = ForkingPickler.loads(ForkingPickler.dumps(sent))
        assert (type(got), got.requires_grad, got.layout) == (type(torchs), torchs.requires_grad, torchs.layout)
        assert got.is_sparse or got.is_shared()
        assert torch.equal(got.to_dense(), sent.to_dense())


def test_a_conjugate_or_negative_view_arrives_with_its_values_where_torchs_way_changes_them():
    conjugated = torch.tensor([1 + 2j, 3 - 4j]).conj()
    negated = torch.tensor([1 + 2j]).conj().imag
    large = torch.full((SMALL_STORAGE_BYTES // 8 + 1,), 1 + 2j, dtype=torch.complex64).conj()
    assert not torch.equal(ForkingPickler.loads(ForkingPickler.dumps(conjugated)), conjugated)  # torch's way
    received = _sent([conjugated, negated, large])
    for got, sent in zip(received, [conjugated, negated, large]):
        assert torch.equal(got, sent)
        assert not got.is_conj() and not got.is_neg()
    assert [got.is_shared() for got in received] == [False, False, True]


_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
           torch.float32, torch.float64, torch.complex64, torch.bool]


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(_DTYPES), length=st.integers(0, 64), start=st.integers(0, 64),
       shape=st.lists(st.integers(0, 4), min_size=0, max_size=3), transpose=st.booleans())
def test_any_view_of_a_small_storage_arrives_with_its_layout(dtype, length, start, shape, transpose):
    base = (torch.arange(length + 64) % 5).to(dtype)
    numel = 1
    for size in shape:
        numel *= size
    view = base[start:start + numel].view(shape) if start + numel <= base.numel() else base[:0]
    if transpose and view.dim() >= 2:
        view = view.transpose(0, 1)
    got_view, got_base = _sent((view, base))
    _assert_same(got_view, view)
    _assert_same(got_base, base)
    assert got_view.untyped_storage().data_ptr() == got_base.untyped_storage().data_ptr() or base.numel() == 0


class _Rows(Dataset):
    """Row `i`: a small feature tensor and a label; `large` adds a tensor over the limit."""

    def __init__(self, large: bool) -> None:
        self.large = large

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int):
        row = {"features": torch.full((3,), float(index)), "label": index}
        if self.large:
            row["image"] = torch.full((SMALL_STORAGE_BYTES // 4,), float(index))
        return row


@pytest.mark.parametrize("large", [False, True])
def test_a_loaders_worker_batches_are_the_single_process_ones_small_tensors_by_value(large):
    def batches(workers: int):
        loader = ResumableDataLoader(_Rows(large), batch_size=4, shuffle=True, seed=3, num_workers=workers)
        return list(loader)

    alone, with_workers = batches(0), batches(2)
    assert len(alone) == len(with_workers) == 3
    for single, worker in zip(alone, with_workers):
        assert single.keys() == worker.keys()
        for key in single:
            _assert_same(worker[key], single[key])
        assert not worker["features"].is_shared() and not worker["label"].is_shared()
        if large:
            assert worker["image"].is_shared()


def test_a_streams_worker_batches_are_the_single_process_ones_small_tensors_by_value(tmp_path):
    urls = write_shards(str(tmp_path))

    def batches(workers: int):
        stream = make_stream(urls, canonical_streams=2)  # the same batches at any number of workers
        return list(ResumableDataLoader(stream, batch_size=4, num_workers=workers, even_batches=False))

    alone, with_workers = batches(0), batches(2)
    assert [batch.tolist() for batch in with_workers] == [batch.tolist() for batch in alone]
    assert not any(batch.is_shared() for batch in with_workers)


class _Conjugated(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([index + 1j]).conj()


def test_a_conjugate_sample_from_a_worker_keeps_its_values():
    """batch_size=None: the sample's conjugate view reaches the pickler, which torch's way
    delivers unconjugated."""
    with_workers = list(ResumableDataLoader(_Conjugated(), batch_size=None, num_workers=2))
    assert [sample.tolist() for sample in with_workers] == [[complex(index, -1)] for index in range(4)]


def test_two_storages_at_one_address_arrive_each_with_its_own_bytes():
    """numpy views from the same first element: two storages, one address, different sizes."""
    array = numpy.arange(10, dtype=numpy.float64)
    head, whole = torch.from_numpy(array[:2]), torch.from_numpy(array)
    assert head.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()
    got_head, got_whole = _sent((head, whole))
    _assert_same(got_head, head)
    _assert_same(got_whole, whole)
