"""Builds loader states for simulated jobs, for tests of the remapping arithmetic."""

from __future__ import annotations

from dist_resume.positions.elastic_plan import Plan
from dist_resume.positions.layout import Layout, TailMode
from dist_resume.positions.remap import ResumePlan
from dist_resume.state.fields import FORMAT_VERSION, RankState, Sampling, encode, plan_digest, rank_key


def job_states(
    job: ResumePlan,
    consumed: list[int],
    *,
    seed: int = 0,
    shuffle: bool = False,
    drop_last: bool,
    even_batches: bool,
) -> dict:
    """The merged state dict of every rank of `job` after rank r consumed `consumed[r]` batches in all."""
    layout = job.layout
    plan_values = job.plan.encode()
    merged: dict = {}
    for rank, batches in enumerate(consumed):
        state = RankState(
            version=FORMAT_VERSION,
            dataset_length=job.plan.dataset_length,
            seed=seed,
            shuffle=int(shuffle),
            drop_last=int(drop_last),
            even_batches=int(even_batches),
            sampling=int(Sampling.EPOCH_ORDER),
            epoch=job.epoch,
            world_size=layout.world_size,
            rank=rank,
            batch_size=layout.batch_size,
            global_batch=layout.global_batch,
            batches_consumed=batches,
            samples_consumed=layout.slots_before(rank, batches),
            epoch_finished=int(batches == layout.num_batches(rank)),
            plan_digest=plan_digest(plan_values),
        )
        entry = encode(state, plan_values)
        merged.update(entry)
        merged[rank_key(rank)] = entry[rank_key(rank)]
    return merged


def fresh_states(dataset_length: int, world_size: int, batch_size: int, *, drop_last: bool, even_batches: bool, epoch: int = 0) -> dict:
    """The state of every rank of a job that has not consumed anything of `epoch`."""
    mode = TailMode.of(drop_last, even_batches)
    plan = Plan(dataset_length, mode, epoch)
    job = ResumePlan(epoch, plan, Layout(dataset_length, world_size, batch_size, mode), (0,) * world_size)
    return job_states(job, [0] * world_size, drop_last=drop_last, even_batches=even_batches)
