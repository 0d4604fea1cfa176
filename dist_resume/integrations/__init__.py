"""Glue for the frameworks people train with: one module per framework, each importing it
lazily (dist_resume itself never needs them). The top of the library: imports `loader`,
`positions` and `state`; nothing in the package but its face (`dist_resume`) imports it."""
