"""Where each sample goes: the epoch order of positions (`epoch_order`, or a dataset's own,
`dataset_order`), how an epoch's positions are laid out in global batches over the ranks
(`layout`), the elastic plan that re-partitions what is left after a resize
or after batches delivered out of order (`elastic_plan`), a rank's batches' positions over
it (`rank_batches`), what skipping global batches passes over (`skip_span`), and the resume
of a saved state at another world size or batch size (`remap`, `plan_resume`). Pure
arithmetic on positions: imports `state` (the saved fields it reads) and `randomness`
(seeds) only."""

from dist_resume.positions.remap import PlannedBatch, ResumePlan, plan_resume

__all__ = ["PlannedBatch", "ResumePlan", "plan_resume"]
