"""ggtools' tests and their helpers, imported from the repository root as `tests.<module>`."""
