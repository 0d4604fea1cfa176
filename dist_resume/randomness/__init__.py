"""Seeds and generators (G4): seeds derived from `(seed, epoch, position)`, the per-sample
generator a dataset draws from (`sample_seed`, `sample_generator`), the per-item seeding of a
stream's items (`per_item`), views of the global
`torch`, `random` and `numpy` generators to seed and restore them, and the generator state
of a user's random sampler. The bottom of the data path: imports nothing of dist_resume."""

from dist_resume.randomness.per_sample import sample_generator, sample_seed

__all__ = ["sample_generator", "sample_seed"]
