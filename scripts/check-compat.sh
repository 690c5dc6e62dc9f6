#!/usr/bin/env bash
# The crash-safety and end-to-end suites against a second Ray version (default 2.59.0; the lock pins
# 2.60.0), in a venv of its own that differs from .venv in Ray alone: it sees .venv's packages through a
# .pth file and installs only Ray (and the project, editable) itself. Usage:
#   scripts/check-compat.sh                  # ray 2.59.0: tests/faults and tests/e2e
#   RAY_VERSION=2.58.0 scripts/check-compat.sh tests/e2e/test_worker_faults.py
# Needs `make install` first. Prints pytest's summary line; exits with pytest's code.
set -euo pipefail
cd "$(dirname "$0")/.."
RAY_VERSION="${RAY_VERSION:-2.59.0}"
VENV=".venv-ray-${RAY_VERSION}"
test -x .venv/bin/python || { echo "run 'make install' first (the compat venv builds on .venv)" >&2; exit 2; }
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  base=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  mine=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$base" > "$mine/zz-layerlab-base.pth"   # after the venv's own site-packages: its Ray wins
fi
"$VENV/bin/python" -m pip install -qq "ray[train,tune]==${RAY_VERSION}"
# .venv's command-line tools the tests start (moto_server, mlflow, ...) that this venv did not install itself
for tool in .venv/bin/*; do
  [ -e "$VENV/bin/$(basename "$tool")" ] || ln -s "$(realpath "$tool")" "$VENV/bin/$(basename "$tool")"
done
"$VENV/bin/python" -m pip install -qq --no-deps -e .
got=$("$VENV/bin/python" -c 'import ray; print(ray.__version__)')
[ "$got" = "$RAY_VERSION" ] || { echo "the compat venv imports ray $got, not $RAY_VERSION" >&2; exit 2; }
# The Ray-facing suites: faults, end to end, and the workers' tests that run real Tune storage and trials.
[ $# -gt 0 ] || set -- tests/faults tests/e2e tests/workers/test_storage.py tests/workers/test_trainable_checkpoints.py \
  tests/workers/test_trainable_train_resume.py
echo "ray $got in $VENV; running: $*"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
