"""Fault campaigns (issue 7): object-store faults, local storage faults, killed DataLoader
workers, bad input and SIGKILLed multi-process jobs, each counted in one ``Summary``.

``python -m tests.faults.run [--long]`` runs them all and prints the summary; the
``test_*`` modules here run the CI size and assert its zero counts.
"""
