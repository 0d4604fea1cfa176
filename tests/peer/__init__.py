"""Run other projects' DataLoader test suites against ResumableDataLoader (see run.py)."""
