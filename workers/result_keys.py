"""The keys a trial's result carries besides the task's own metrics, in one place: what the trainable
(workers.trainable) adds to each report, what Tune adds, and what the driver's callback (workers.callbacks) reads.

Imported inside trial processes: keep it free of the service, of MLflow and of Ray.
"""

from __future__ import annotations

ITERATION_KEY = "layerlab_iteration"
"""The trial's own report count, continued from the checkpoint it resumed from. The step of its metrics in the
queue and MLflow (Tune's training_iteration restarts from Tune's checkpoint, which may be older than the one the
trial resumed from), and PBT's clock (workers.pbt)."""
REPLAYED_KEY = "layerlab_replayed"
"""Marks the stored final result of a trial that had finished before a restore."""
ARTIFACTS_KEY = "artifacts"
"""Files from `session.log_artifact`, on their way to the driver (name -> base64)."""
NODE_KEY = "node_id"
"""The Ray node that ran the trial (node_ip alone cannot tell apart nodes on one host)."""
EXPLOIT_KEY = "layerlab_exploit"
"""On a trial's first report after PBT gave it another trial's weights: where they came from (that trial and its
step) and the config values that changed (name -> [the source's value, this trial's])."""
TUNE_KEYS = frozenset(
    {"timestamp", "checkpoint_dir_name", "should_checkpoint", "done", "training_iteration", "trial_id", "date",
     "time_this_iter_s", "time_total_s", "pid", "hostname", "node_ip", "config", "time_since_restore",
     "iterations_since_restore", "experiment_tag"}
)  # fmt: skip
"""Keys Tune adds to every result: left out of a trial's stored final result (Tune adds them again)."""
