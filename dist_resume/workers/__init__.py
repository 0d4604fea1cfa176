"""The protocol between a loader's worker processes and its main process: batches tagged
with the worker role that produced them and what they advanced, the end-of-pass report, a
worker taking over another worker's role on resume, and a batch's small tensors sent by
value rather than as shared memory. Shared by `streams` and `loader`, so it stands below
both; imports nothing of dist_resume."""
