"""`ResumableDataLoader` under Hugging Face transformers' `Trainer`.

`Trainer` resumes a mid-epoch checkpoint by skipping the epoch's first batches with
accelerate's `skip_first_batches`, which rebuilds a plain `DataLoader` from the loader's
`batch_sampler`: another order on every rank (the loader refuses to be rebuilt). Its own
checkpoint knows nothing of the loader. `ResumableTrainerMixin` turns the skipping off
(`ignore_data_skip=True`) and keeps the loader's position in every checkpoint instead:

- each time `Trainer` may save (its flow has set `should_save` or `should_evaluate` at the
  end of a step or an epoch), every rank's loader state is gathered (a collective over the
  default process group), and rank 0 stores them in the checkpoint's `trainer_state.json`,
  with the global step they were taken at, written by `Trainer` with its own state;
- on `train(resume_from_checkpoint=...)`, every rank loads all saved entries before the
  first batch: the loader continues on the exact next sample, at the same or another
  world size that keeps the global batch (`Trainer` counts epochs by global steps). The
  entry is checked first: its structure, its global batch, and the batches of the run it
  had served against `Trainer`'s global step.

transformers itself is imported only when a trainer is built (the callback class derives
from its `TrainerCallback`).
"""

from __future__ import annotations

import functools
import json
from typing import Any

import torch.distributed as dist

from dist_resume.loader.resumable import ResumableDataLoader
from dist_resume.state.fields import UNKNOWN_STEP, ResumeStateError
from dist_resume.state.json_form import state_from_json, state_to_json
from dist_resume.state.saved import decode

# The callback's class name, under which Trainer keeps its state in trainer_state.json's
# "stateful_callbacks".
CALLBACK_NAME = "ResumableLoaderState"


class ResumableTrainerMixin:
    """Put before `transformers.Trainer` (or a subclass of it) in a class whose
    `get_train_dataloader()` returns a `ResumableDataLoader` built there::

        class MyTrainer(ResumableTrainerMixin, Trainer):
            def get_train_dataloader(self):
                return ResumableDataLoader(self.train_dataset, batch_size=..., shuffle=True, seed=0)

    Guarantee: every checkpoint `Trainer` writes holds every rank's loader position, and
    `train(resume_from_checkpoint=...)` continues on the exact next sample (G1), at the same
    or another world size with the same global batch (`world_size x per-device batch size`,
    G2, G3). Sets `args.ignore_data_skip = True` (Trainer's batch skipping would train
    another order). A resume that cannot be exact is refused with `ResumeStateError` before
    the first batch: a checkpoint without the loader's state or with a damaged one, another
    global batch, a loader state taken at another step than Trainer's (edited, mixed, or
    another `gradient_accumulation_steps`), or a resume inside an epoch whose batches
    `gradient_accumulation_steps` does not divide.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.args.ignore_data_skip = True
        callback_type = _callback_type()
        if not any(isinstance(callback, callback_type) for callback in self.callback_handler.callbacks):
            self.add_callback(callback_type())


@functools.cache
def _callback_type() -> type:
    from transformers import TrainerCallback
    from transformers.trainer_callback import ExportableState

    class ResumableLoaderState(TrainerCallback, ExportableState):
        """Gathers every rank's loader state when Trainer may save, hands it to Trainer's
        state file (`state()`), and loads it back when training resumes. Holds nothing
        else, so Trainer may rebuild it from `state()` (restore_callback_states_from_checkpoint)."""

        def __init__(self, loader_state: Any = None, global_step: int | None = None) -> None:
            self.loader_state = loader_state
            self.global_step = global_step

        def state(self) -> dict[str, Any]:
            return {"args": {}, "attributes": {"loader_state": self.loader_state, "global_step": self.global_step}}

        def on_train_begin(self, args: Any, state: Any, control: Any, train_dataloader: Any = None, **kwargs: Any) -> None:
            loader = _checked_loader(train_dataloader, args)
            self.loader_state, self.global_step = None, None
            if state.global_step > 0:
                _resume(loader, state, args)

        def on_step_end(self, args: Any, state: Any, control: Any, train_dataloader: Any = None, **kwargs: Any) -> None:
            self._capture(state, control, train_dataloader)

        def on_epoch_end(self, args: Any, state: Any, control: Any, train_dataloader: Any = None, **kwargs: Any) -> None:
            self._capture(state, control, train_dataloader)

        def _capture(self, state: Any, control: Any, loader: ResumableDataLoader) -> None:
            # Every rank decides alike (Trainer's flow is a function of the step), so every
            # rank joins the gather; the processes that save (rank 0) write it.
            if control.should_save or control.should_evaluate:
                self.loader_state = json.loads(state_to_json(_every_rank(loader)))
                self.global_step = state.global_step

    return ResumableLoaderState


def _checked_loader(loader: Any, args: Any) -> ResumableDataLoader:
    if not isinstance(loader, ResumableDataLoader):
        raise TypeError(
            f"ResumableTrainerMixin: get_train_dataloader() returned a {type(loader).__name__}; return the "
            "ResumableDataLoader itself (not passed through accelerator.prepare), built in get_train_dataloader()"
        )
    if (loader.world_size, loader.rank) != (args.world_size, args.process_index):
        raise ValueError(
            f"the loader shards over {loader.world_size} rank(s) as rank {loader.rank}, but this Trainer process is "
            f"{args.process_index} of {args.world_size}; build the ResumableDataLoader in get_train_dataloader() "
            "so that it takes its rank and world size from the process group"
        )
    return loader


def _every_rank(loader: ResumableDataLoader) -> dict[str, Any]:
    own = loader.state_dict()
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return own
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, own)
    merged: dict[str, Any] = {}
    for entry in gathered:
        merged.update(entry)
    return merged


def _resume(loader: ResumableDataLoader, state: Any, args: Any) -> None:
    step = state.global_step
    loaded = _saved_loader_state(state)
    saved = decode(loaded)
    saved_rank, now = saved.any, decode(loader.state_dict()).any  # the loader's own layout, as a save records it
    if saved_rank.global_batch != now.global_batch:
        raise ResumeStateError(
            f"the checkpoint of global step {step} was saved at a global batch of "
            f"{_global_batch(saved_rank.world_size, saved_rank.batch_size)}; this Trainer trains "
            f"{_global_batch(now.world_size, now.batch_size)}: Trainer counts epochs and the end of the run in "
            "global steps, so at another global batch it would train samples twice or never. Resume with the global "
            "batch of the save (processes x per_device_train_batch_size)"
        )
    batches = _length(loader)  # what Trainer read, before the state is loaded
    steps_per_epoch = _trainer_steps_per_epoch(batches, args)
    accumulation = args.gradient_accumulation_steps
    loader_epoch = saved_rank.epoch + saved_rank.epoch_finished
    trainer_epoch = step // steps_per_epoch
    if loader_epoch != trainer_epoch:
        raise ResumeStateError(
            f"Trainer resumes global step {step} in its epoch {trainer_epoch} ({steps_per_epoch} steps per epoch at "
            f"gradient_accumulation_steps={accumulation}) but the loader's state continues epoch {loader_epoch}: "
            "Trainer counts epochs by global steps and would restart the loader in another epoch. "
            + ("A loader without a length resumes only from a checkpoint of its first epoch" if batches is None else
               "The loader state comes from another step (trainer_state.json edited, or files of two checkpoints "
               "mixed), or gradient_accumulation_steps changed since the save")
        )
    if all(entry.global_step != UNKNOWN_STEP for entry in saved.ranks.values()):
        _require_same_step(saved.global_step, step, batches, steps_per_epoch, accumulation)
    if accumulation > 1 and batches is not None and batches % accumulation and saved_rank.batches_consumed \
            and not saved_rank.epoch_finished:
        raise ResumeStateError(
            f"resuming inside epoch {loader_epoch}, whose {batches} batches gradient_accumulation_steps="
            f"{accumulation} does not divide: Trainer counts accumulation by the batch's index in the epoch, which "
            "restarts at 0 on a resume, and would not step the optimizer after the epoch's last, partial "
            "accumulation; resume from a checkpoint at an epoch's end, or make the batches per epoch a multiple of "
            "gradient_accumulation_steps (batch size, drop_last)"
        )
    loader.load_state_dict(loaded)


def _saved_loader_state(state: Any) -> dict[str, Any]:
    """The loader state that the checkpoint Trainer resumes holds for the global step it
    resumes, checked to be the mixin's whole entry."""
    step = state.global_step
    saved = (state.stateful_callbacks or {}).get(CALLBACK_NAME)
    if saved is None:
        raise ResumeStateError(
            f"the checkpoint Trainer resumes (global step {step}) holds no loader state: it was saved by a Trainer "
            "without ResumableTrainerMixin; resume it with that Trainer, or start the run anew"
        )
    damaged = f"the checkpoint of global step {step} holds a damaged loader state in trainer_state.json " \
              f"(stateful_callbacks[{CALLBACK_NAME!r}]): "
    attributes = saved.get("attributes") if isinstance(saved, dict) else None
    if not isinstance(attributes, dict):
        raise ResumeStateError(damaged + "its 'attributes' are not an object, as the mixin writes them")
    taken, loader_state = attributes.get("global_step"), attributes.get("loader_state")
    if not (taken is None or type(taken) is int) or not (loader_state is None or isinstance(loader_state, dict)):
        raise ResumeStateError(damaged + "its 'global_step' is not a number or its 'loader_state' not an object")
    if taken != step or loader_state is None:
        raise ResumeStateError(
            f"the checkpoint of global step {step} holds the loader state of "
            f"{'no step' if taken is None else f'global step {taken}'}: a callback set control.should_save after "
            "ResumableTrainerMixin's callback had run at the end of that step; pass that callback in "
            "Trainer(callbacks=[...]), which runs it first"
        )
    try:
        return state_from_json(json.dumps(loader_state))
    except ResumeStateError as exc:
        raise ResumeStateError(damaged + str(exc)) from None


def _global_batch(processes: int, batch_size: int) -> str:
    return f"{processes * batch_size} samples per step ({processes} process{'es' * (processes > 1)} x {batch_size})"


def _require_same_step(loader_batches: int, step: int, batches: int | None, steps_per_epoch: int,
                       accumulation: int) -> None:
    """The loader's entries recorded how many batches of the run they had served; Trainer's
    global step must stand after as many, or it resumes another place than the loader's."""
    if batches is None:  # a loader without a length, in its first epoch (else refused before)
        expected, per_epoch = step * accumulation, "a loader without a length"
    else:
        expected = step // steps_per_epoch * batches + step % steps_per_epoch * accumulation
        per_epoch = f"{batches} batches per epoch"
    if loader_batches != expected:
        raise ResumeStateError(
            f"the checkpoint of global step {step} holds a loader state taken after {loader_batches} batches of the "
            f"run, but Trainer's global step {step} stands after {expected} ({per_epoch}, "
            f"gradient_accumulation_steps={accumulation}): the loader state comes from another step "
            "(trainer_state.json edited, or files of two checkpoints mixed), or gradient_accumulation_steps changed "
            "since the save; resume from a checkpoint as Trainer wrote it, with the gradient_accumulation_steps of "
            "the save"
        )


def _length(loader: ResumableDataLoader) -> int | None:
    try:
        return len(loader)
    except (TypeError, NotImplementedError):
        return None


def _trainer_steps_per_epoch(batches: int | None, args: Any) -> int:
    # As Trainer.set_initial_training_values counts them from the loader's length: optimizer
    # steps per epoch, or max_steps for a loader without a length (Trainer then counts every
    # pass from epoch 0).
    if batches is None:
        return max(args.max_steps, 1)
    return max(-(-batches // args.gradient_accumulation_steps), 1)
