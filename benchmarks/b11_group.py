"""One replica group of B11's side-by-side run: the same torchft loop (the demo group's:
batch, quorum, forward, backward, manager.allreduce per gradient, should_commit) takes its
batches from ManagedLoader (with per-sample seeding, G4, and without) and from torchft's
DistributedSampler (twice: two loaders alike, the run's own noise) in rounds of one block of
steps per loader, each round in another order, and writes each block's step times by the
loader it used (``--result``, JSON: ``steps``), and how long each step waited for its batch,
the quorum left out (``data``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dist_resume import ManagedLoader, ResumableDataLoader
from dist_resume.demo.data import SyntheticDataset, make_model
from dist_resume.demo.torchft_group import GroupState, build_manager, managed_batches, parser, sampler_batches
from dist_resume.integrations.torchft import allreduce_gradients

from .timing import balanced_rounds

MANAGED, UNSEEDED, SAMPLER, SAMPLER_AGAIN = "managed", "managed-unseeded", "sampler", "sampler-again"
MODES = (MANAGED, UNSEEDED, SAMPLER, SAMPLER_AGAIN)
_POLL_SECONDS = 0.05


def _time_quorums(manager: Any) -> list[float]:
    """Time every `manager.start_quorum()` from now on: the seconds of each call since the
    list was last cleared."""
    seconds: list[float] = []
    start_quorum = manager.start_quorum

    def timed(*args: Any, **kwargs: Any) -> None:
        began = time.perf_counter()
        try:
            start_quorum(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - began)

    manager.start_quorum = timed
    return seconds


def main() -> None:
    options = parser()
    options.add_argument("--cycles", type=int, default=1, help="cycles of balanced_rounds(MODES)")
    options.add_argument("--block-steps", type=int, default=20)
    options.add_argument("--result", type=Path, required=True)
    args = options.parse_args()
    args.epochs = 1_000_000  # neither loader runs out
    torch.manual_seed(args.seed)
    dataset = SyntheticDataset(args.dataset_size)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    state = GroupState(model, optimizer, None)
    manager, _store = build_manager(args, state)
    state.manager = manager
    quorums = _time_quorums(manager)  # before the ManagedLoaders, which call what they find
    managed = {mode: ManagedLoader(ResumableDataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                                                      seed=args.seed, num_workers=args.num_workers, rank=0,
                                                      world_size=1, deterministic_transforms=mode == MANAGED),
                                   manager, key=f"dist_resume_loader_{mode}")
               for mode in (MANAGED, UNSEEDED)}
    sources = {mode: managed_batches(loader, args.epochs) for mode, loader in managed.items()}
    sources[SAMPLER] = sampler_batches(args, dataset)
    sources[SAMPLER_AGAIN] = sampler_batches(args, dataset)
    args.ready_file.write_text("")
    while not args.start_file.exists():
        time.sleep(_POLL_SECONDS)
    loss_fn = nn.CrossEntropyLoss()
    blocks: dict[str, list[list[float]]] = {mode: [] for mode in MODES}
    data: dict[str, list[list[float]]] = {mode: [] for mode in MODES}
    # Each loader follows each other one equally often: what a block inherits from the one
    # before it (warm caches, workers that prefetched) falls on all alike.
    orders = balanced_rounds(list(MODES))
    for name in (name for _ in range(args.cycles) for order in orders for name in order):
        times, waits = [], []
        for index in range(args.block_steps):
            quorums.clear()
            began = time.perf_counter()
            _, (features, labels, _) = next(sources[name])
            served = time.perf_counter()
            if name in (SAMPLER, SAMPLER_AGAIN):
                manager.start_quorum()  # as torchft's OptimizerWrapper.zero_grad does
            loss_fn(model(features), labels).backward()
            allreduce_gradients(manager, model)
            if manager.should_commit():
                optimizer.step()
            optimizer.zero_grad()
            if index:  # a block's first step follows the other loader's steps
                times.append(time.perf_counter() - began)
                waits.append(served - began - (sum(quorums) if name in managed else 0.0))
        blocks[name].append(times)
        data[name].append(waits)
        if name in managed:
            managed[name].state_dict()  # settles its last step before other loaders' steps move the Manager on
    args.result.write_text(json.dumps({"steps": blocks, "data": data}))
    manager.shutdown(wait=False)


if __name__ == "__main__":
    main()
