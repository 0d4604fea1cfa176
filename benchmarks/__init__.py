"""Benchmarks of dist-resume against torch's DataLoader, torchdata and plain I/O: `python -m benchmarks.run`."""
