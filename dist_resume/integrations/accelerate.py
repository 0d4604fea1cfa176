"""Hugging Face `accelerate` with `ResumableDataLoader`.

`attach(accelerator, loader)` keeps the loader through `accelerator.prepare` (accelerate
would otherwise rebuild it as its own `DataLoaderShard`: another order, no per-sample seeds,
no resume), and makes `accelerator.save_state` / `load_state` save and restore every rank's
position in it, so a resume at the same or another number of processes continues on the
exact next sample (G1-G3).

Each rank writes its own loader state as JSON next to accelerate's files (accelerate keeps
one file per loader, written by every rank to the same path), and every rank reads all of
them back: the elastic re-partition needs every saved rank's entry.
"""

from __future__ import annotations

import os
import re
import weakref
from typing import Any

from dist_resume.checkpoint.bounded_files import read_whole
from dist_resume.errors import CheckpointError
from dist_resume.loader.resumable import ResumableDataLoader
from dist_resume.state.fields import ResumeStateError, rank_key, rank_of
from dist_resume.state.json_form import state_from_json, state_to_json
from dist_resume.state.saved import decode
from dist_resume.storage import resolve

_STATE_FILE_LIMIT = 2**28  # bytes of one rank's loader state in JSON

# The folder inside accelerate's checkpoint directory that holds the loader states.
STATE_FOLDER = "dist_resume"

# Accelerator -> the loaders attached to it, in attach order (their index names their files).
_attached: weakref.WeakKeyDictionary[Any, list[ResumableDataLoader]] = weakref.WeakKeyDictionary()


def attach(accelerator: Any, loader: ResumableDataLoader) -> ResumableDataLoader:
    """Make `accelerator.prepare` return `loader` unchanged, and `accelerator.save_state` /
    `load_state` save and resume its exact position on every rank, also when the job resumes
    with another number of processes. Returns `loader`. Build the loader after the
    `Accelerator` (so that it takes its rank and world size from the process group), call
    `attach` before `load_state`, and attach loaders in the same order in every run."""
    if not isinstance(loader, ResumableDataLoader):
        raise TypeError(f"attach expects a ResumableDataLoader, got {type(loader).__name__}")
    _check_compatible(accelerator, loader)
    loaders = _attached.get(accelerator)
    if loaders is None:
        loaders = _attached[accelerator] = []
        accelerator.register_save_state_pre_hook(lambda models, weights, output_dir: _save_all(loaders, output_dir))
        accelerator.register_load_state_pre_hook(lambda models, input_dir: _load_all(loaders, input_dir))
    if not any(known is loader for known in loaders):
        loaders.append(loader)
    # accelerate's own guard against preparing a loader twice: `prepare` then keeps it as is.
    loader._is_accelerate_prepared = True
    return loader


def _check_compatible(accelerator: Any, loader: ResumableDataLoader) -> None:
    processes, index = accelerator.num_processes, accelerator.process_index
    if (loader.world_size, loader.rank) != (processes, index):
        raise ValueError(
            f"the loader shards over {loader.world_size} rank(s) as rank {loader.rank}, but this accelerate "
            f"process is {index} of {processes}; build the ResumableDataLoader after Accelerator() so that "
            "it takes its rank and world size from the process group"
        )
    for option in ("split_batches", "dispatch_batches"):
        if getattr(accelerator, option, None):
            raise ValueError(
                f"Accelerator({option}=True) is not supported with a ResumableDataLoader: its batch_size is "
                "per process and every process loads its own batches"
            )
    if not loader.drop_last and bool(accelerator.even_batches) != loader.even_batches:
        raise ValueError(
            f"Accelerator(even_batches={accelerator.even_batches}) but the loader has "
            f"even_batches={loader.even_batches}; give the loader the same even_batches"
        )


def _state_path(directory: str, index: int, rank: int) -> str:
    return os.path.join(directory, f"loader_{index}_rank_{rank}.json")


def _save_all(loaders: list[ResumableDataLoader], output_dir: str) -> None:
    directory = os.path.join(output_dir, STATE_FOLDER)
    os.makedirs(directory, exist_ok=True)
    for index, loader in enumerate(loaders):
        path = _state_path(directory, index, loader.rank)
        partial = f"{path}.partial-{os.getpid()}"
        with open(partial, "w", encoding="utf-8") as file:
            file.write(state_to_json(loader.state_dict()))
        os.replace(partial, path)
        if loader.rank == 0:
            # A directory reused from a larger job: its extra ranks' files would be mixed in.
            for rank in _saved_ranks(directory, index, strict=False):
                if rank >= loader.world_size:
                    os.remove(_state_path(directory, index, rank))


def _saved_ranks(directory: str, index: int, strict: bool = True) -> list[int]:
    """The ranks whose state files of loader ``index`` are in ``directory``; a file named
    like one but not as this module names them is refused (``strict``) or left alone."""
    pattern = re.compile(rf"loader_{index}_(rank_.*)\.json", re.DOTALL)
    names = os.listdir(directory) if os.path.isdir(directory) else []
    ranks = []
    for match in filter(None, map(pattern.fullmatch, names)):
        try:
            ranks.append(rank_of(match.group(1)))
        except ResumeStateError as error:
            if strict:
                raise ResumeStateError(f"{os.path.join(directory, match.group(0))} is not a state file this "
                                       f"library writes: {error}") from None
    return sorted(ranks)


def _load_all(loaders: list[ResumableDataLoader], input_dir: str) -> None:
    for index, loader in enumerate(loaders):
        loader.load_state_dict(_read_saved_state(input_dir, index))


def _read_saved_state(input_dir: str, index: int) -> dict[str, Any]:
    # Every saved rank's entries, merged: the elastic re-partition needs them all.
    directory = os.path.join(input_dir, STATE_FOLDER)
    ranks = _saved_ranks(directory, index)
    if not ranks:
        raise ResumeStateError(
            f"accelerate checkpoint {input_dir} holds no state for attached loader {index} "
            f"(no {STATE_FOLDER}/loader_{index}_rank_*.json): it was saved without "
            "dist_resume.integrations.accelerate.attach, or with fewer loaders attached"
        )
    merged: dict[str, Any] = {}
    for rank in ranks:
        path = _state_path(directory, index, rank)
        try:
            text = read_whole(resolve(directory), path, f"loader state file {path}", _STATE_FILE_LIMIT).decode()
            state = state_from_json(text)
        except CheckpointError as error:  # not a regular file, larger than any loader state
            raise ResumeStateError(str(error)) from None
        except (ValueError, KeyError, TypeError) as error:  # UnicodeDecodeError is a ValueError
            raise ResumeStateError(f"loader state file {path} is not a loader state: {error}") from None
        entries = sorted(key for key in state if rank_of(key) is not None)
        if entries != [rank_key(rank)]:
            raise ResumeStateError(f"loader state file {path} holds the entries {entries}, not rank {rank}'s alone")
        merged.update(state)
    saved = decode(merged)
    world_size = saved.any.world_size
    if ranks != list(range(world_size)):
        raise ResumeStateError(
            f"accelerate checkpoint {input_dir} holds loader {index}'s state for ranks {ranks} of a job of "
            f"{world_size}; every rank's file is needed (save_state's directory must be on storage "
            "that every process sees)"
        )
    try:
        saved.require_one_save()
    except ResumeStateError as error:
        raise ResumeStateError(
            f"accelerate checkpoint {input_dir}, loader {index}: {error}. save_state into one directory is not "
            "atomic across processes: save into a new directory each time (ProjectConfiguration("
            "automatic_checkpoint_naming=True)) and resume from the newest one that every process completed"
        ) from None
    return merged
