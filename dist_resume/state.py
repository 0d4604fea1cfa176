"""The loader's saved state: field layout, encoding to int64 tensors, validation."""

# Replicated zero-element tensor of shape (world_size, plan_length). Plain `dcp.load`
# into a loader whose layout differs fails DCP's size check on this key, so the
# error DCP raises names the elastic entry point.
ELASTIC_GUARD_KEY = "elastic_guard__load_with_dist_resume_load_checkpoint"
