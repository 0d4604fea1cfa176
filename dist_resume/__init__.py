"""dist-resume: exact, elastic mid-epoch resume for PyTorch training jobs."""
