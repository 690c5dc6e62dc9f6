"""One module per experiment; each exposes `TASK` (see jobs/registry.py)."""
