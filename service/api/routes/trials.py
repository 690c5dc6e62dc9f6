"""/sweeps/{id}/trials: the sweep's trials, one row each (`layerlab show` and `layerlab compare` read it)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from service.api.deps import StoreDep, get_principal
from service.api.routes.sweeps import SweepId
from service.schemas import ErrorResponse, TrialList, TrialPublic

# Reading is open to every token, as GET /sweeps/{id} is; only cancelling looks at the owner.
router = APIRouter(
    prefix="/sweeps",
    tags=["sweeps"],
    dependencies=[Depends(get_principal)],
    responses={
        401: {"model": ErrorResponse, "description": "missing, unknown or revoked API token"},
        503: {"model": ErrorResponse, "description": "the queue database is down"},
    },
)


@router.get(
    "/{sweep_id}/trials",
    response_model=TrialList,
    responses={404: {"model": ErrorResponse, "description": "no sweep with this id"}},
)
def list_trials(sweep_id: SweepId, store: StoreDep) -> TrialList:
    """Every trial of the sweep so far, in the order they started: state, config, latest iteration and
    metrics, starts. Trials Tune has not started yet have no row (GET /sweeps/{id} counts them as pending)."""
    sweep = store.get(sweep_id)  # SweepNotFound -> 404 (service/app.py)
    space: dict[str, Any] = (sweep.spec or {}).get("space") or {}
    return TrialList(
        sweep_id=sweep.id,
        metric={"name": sweep.metric_name, "mode": sweep.metric_mode},
        space=list(space),
        trials=[TrialPublic.build(t) for t in store.trials(sweep_id)],
    )
