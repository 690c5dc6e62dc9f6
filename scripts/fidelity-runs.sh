#!/usr/bin/env bash
# Run fidelity sweeps whole through the embedded service on a clean checkout of HEAD, and keep their claims.
#
#   scripts/fidelity-runs.sh sweeps/symbolic_prop.yaml sweeps/symbolic_ltl.yaml    # these, one after another
#   scripts/fidelity-runs.sh --all                                                 # every sweeps/*.yaml with claims
#
# HEAD is cloned into a fresh folder (uncommitted changes are not run), an embedded stack starts there on free
# ports with its own LAYERLAB_HOME, and each sweep is submitted and waited for in turn. After each, its parent
# run's claims are pulled into this checkout's docs/claims/ (the file names the commit and that it was clean),
# and a line gives the sweep's state, trials and wall time as the service recorded them (submitted -> finished).
# Then `layerlab claims doc docs/fidelity.md` rewrites the doc's tables from them. The stack stops at the end; its
# MLflow store stays in the printed folder until you delete it. Needs `make install` (the .venv) first.
set -euo pipefail

repo=$(git rev-parse --show-toplevel)
venv=${VENV:-$repo/.venv}
layerlab="$venv/bin/layerlab"
[ -x "$layerlab" ] || { echo "error: $layerlab is missing; run make install first" >&2; exit 2; }

if [ "${1:-}" = "--all" ]; then
    mapfile -t sweeps < <(grep -l '^claims:' "$repo"/sweeps/*.yaml)
else
    sweeps=("$@")
fi
[ "${#sweeps[@]}" -gt 0 ] || { echo "usage: $0 SWEEP.yaml ... | --all" >&2; exit 2; }
for f in "${sweeps[@]}"; do
    [ -f "$f" ] || { echo "error: no sweep file $f" >&2; exit 2; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/layerlab-fidelity.XXXXXX")
git clone -q "$repo" "$work/src"
commit=$(git -C "$work/src" rev-parse HEAD)
free_port() { "$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
api_port=$(free_port)
mlflow_port=$(free_port)
export PYTHONPATH="$work/src" LAYERLAB_HOME="$work/home" LAYERLAB_API_URL="http://127.0.0.1:$api_port"
trap '"$layerlab" down >/dev/null 2>&1 || true' EXIT
echo "commit $commit in $work/src; MLflow UI http://127.0.0.1:$mlflow_port, store under $work/home"
(cd "$work/src" && "$layerlab" up --detach --api-port "$api_port" --mlflow-port "$mlflow_port")

summary=()
for f in "${sweeps[@]}"; do
    rel=$(realpath --relative-to="$repo" "$f")
    submitted=$(cd "$work/src" && "$layerlab" submit "$rel")
    echo "$submitted"
    id=$(sed -n 's/^submitted sweep \([0-9]*\).*/\1/p' <<<"$submitted")
    # watch ends when the sweep does, or on an API call that timed out (2 busy cores): then watch again.
    until (cd "$work/src" && "$layerlab" watch "$id"); do
        state=$("$layerlab" show "$id" --json 2>/dev/null | "$venv/bin/python" -c 'import json, sys; print(json.load(sys.stdin)["state"])' || echo unknown)
        case "$state" in succeeded|failed|cancelled) break ;; esac
        sleep 10
    done
    line=$("$layerlab" show "$id" --json | "$venv/bin/python" -c '
import json, sys
from datetime import datetime
d = json.load(sys.stdin)
t = d["trials"]
took = datetime.fromisoformat(d["finished_at"]) - datetime.fromisoformat(d["submitted_at"]) if d["finished_at"] else "-"
done, total = t.get("finished", 0), t.get("total", "?")
print(d["state"], f"{done}/{total}", str(took).split(".")[0], (d.get("mlflow") or {}).get("parent_run_id") or "-")')
    read -r state trials took run <<<"$line"
    summary+=("$rel: $state, $trials trials, $took (sweep $id, parent run $run)")
    if [ "$state" = "succeeded" ] && grep -q "^claims:" "$work/src/$rel"; then
        "$layerlab" claims pull "$run" --into "$repo/docs/claims" --tracking-uri "http://127.0.0.1:$mlflow_port"
    fi
done

printf '%s\n' "" "commit $commit, $(nproc) cores:" "${summary[@]}"
echo "next: $layerlab claims doc docs/fidelity.md   (and the times into each sweep's header)"
