"""Execution: the claim loop, SweepSpec -> Ray Tune, the MLflow bridge and model registration."""
