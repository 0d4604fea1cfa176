"""One rank of a 2-process gloo job over Hugging Face datasets (tests/test_hf_datasets.py).

Writes to OUT/rank_R.json the dataset values it was given over one epoch, or the error the
loader raised.
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import datasets  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from datasets.distributed import split_dataset_by_node  # noqa: E402

from dist_resume import (
    ResumableDataLoader,  # noqa: E402
    shut_down_distributed,  # noqa: E402
)


def _dataset(kind: str, rank: int, world_size: int):
    data = datasets.Dataset.from_dict({"x": list(range(40))})
    if kind == "iterable_split":
        # Streams are the dataset's to split (the loader shards only map-style datasets).
        return split_dataset_by_node(data.to_iterable_dataset(num_shards=4), rank, world_size).with_format("torch")
    # A map with a lambda gets a random fingerprint per process: the check must not mind.
    data = data.map(lambda row: {"y": row["x"] * 2}).with_format("torch")
    return split_dataset_by_node(data, rank, world_size) if kind == "map_split" else data


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", choices=["map_whole", "map_split", "iterable_split"], required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    try:
        shuffle = None if args.kind == "iterable_split" else True
        loader = ResumableDataLoader(_dataset(args.kind, rank, world_size), batch_size=4, shuffle=shuffle, seed=0)
        result = {"values": [int(x) for batch in loader for x in torch.as_tensor(batch["x"]).tolist()]}
    except ValueError as error:
        result = {"error": str(error)}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank_{rank}.json"), "w") as file:
        json.dump(result, file)
    shut_down_distributed()


if __name__ == "__main__":
    main()
