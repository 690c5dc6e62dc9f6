#!/usr/bin/env bash
# Every GPU check of issue 20 item 5 in one run of at most 8 minutes, printed as one table:
# the Tversky head benchmark (ours vs the official tversky==0.2.1 layer), a GPT-2 small training step in
# tokens/s (linear head, our Tversky head, the official one), official vs ours in float32, bf16 against
# float32, and a one-GPU sweep through the service as a Ray Train job (scripts/gpu_acceptance.py says how).
#
#   scripts/gpu-acceptance.sh              # on a GPU machine (H100/H200)
#   scripts/gpu-acceptance.sh --dry-run    # on the CPU at toy sizes, in seconds (tests/scripts runs it)
#
# PYTHON picks the interpreter (default: the repository's .venv). Exit status: 0 all checks passed, 1 a check
# failed (FAIL in the table), 2 no GPU without --dry-run, 124 the 8 minutes ran out.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
# SIGINT first, so the sweep check's `layerlab down` still runs; SIGKILL 60 s later if it hangs.
exec timeout --signal=INT --kill-after=60 480 "$PYTHON" scripts/gpu_acceptance.py --budget 450 "$@"
