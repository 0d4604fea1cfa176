"""Glue for the frameworks people train with: one module per framework, each importing it
lazily (dist_resume itself never needs them)."""
