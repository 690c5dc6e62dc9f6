"""/code: the researcher's code a sweep brings, uploaded before the sweep that names it (`layerlab submit`).

The API stores the archive (content-addressed, once per content) after checking its index
(service.code_archive.check); it never imports or runs the code. Workers run it with their own privileges,
so an operator may switch the feature off (LAYERLAB_ALLOW_CODE=0).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Request, status
from pydantic import BaseModel

from service.api.deps import PrincipalDep, SettingsDep, StoreDep, get_principal, read_body, require_code_allowed
from service.code_archive import MAX_PACKED_BYTES, CodeArchiveError
from service.schemas import AUTH_AND_DATABASE, error_doc


class CodeStored(BaseModel):
    sha256: str
    files: int
    new: bool
    """False where the same archive was stored before: nothing new was stored."""


router = APIRouter(
    prefix="/code",
    tags=["code"],
    dependencies=[Depends(get_principal)],
    responses=AUTH_AND_DATABASE,
)


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=CodeStored,
    responses={
        403: error_doc("brought code is switched off on this deployment"),
        413: error_doc("archive over the size limit"),
        422: error_doc("not a gzipped tar, or it holds links, special files or paths outside its folder"),
    },
    # Sent as application/gzip by the CLI; any content type is read as the archive's bytes.
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        }
    },
)
async def upload_code(request: Request, store: StoreDep, settings: SettingsDep, principal: PrincipalDep) -> CodeStored:
    """Store a gzipped tar of the researcher's code; answer its sha256, which POST /sweeps?code_sha256= names."""
    require_code_allowed(settings)
    body = await read_body(request, MAX_PACKED_BYTES)
    try:
        digest, files, new = store.put_code(body, uploaded_by=principal.user)
    except CodeArchiveError as exc:
        raise HTTPException(422, f"code archive refused: {exc}") from None
    return CodeStored(sha256=digest, files=files, new=new)
