#!/bin/sh
# A queue worker drives Ray Tune from its own process, and `ray.init(address=RAY_ADDRESS)` attaches a
# driver only on a machine that runs a Ray node. So the worker's container first joins the cluster as a
# node with no CPUs and no GPUs (Ray never places a trial there), then runs the claim loop.
set -eu

if [ -z "${RAY_ADDRESS:-}" ]; then
    echo "layerlab-worker.sh: set RAY_ADDRESS to the Ray head's GCS address, e.g. ray-head:6380" >&2
    exit 64
fi
ray start --address="$RAY_ADDRESS" --num-cpus=0 --num-gpus=0 --disable-usage-stats
exec layerlab worker "$@"
