"""API tokens: created and revoked by an operator (`layerlab token ...`), checked on every request.

A token is `ll_` + 32 random bytes (URL-safe base64). The database keeps its SHA-256 only: the token
has 256 bits of entropy, so a fast hash is enough (no salt or key stretching needed), and a lookup by
hash is one indexed query.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

from sqlalchemy import select

from service.models import ApiToken, utcnow
from service.queue import QueueStore

PREFIX = "ll_"
USER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,99}$")


@dataclass(frozen=True)
class Principal:
    """Who a request acts as."""

    user: str
    admin: bool
    token_id: int


@dataclass(frozen=True)
class TokenInfo:
    id: int
    user: str
    prefix: str
    admin: bool
    created_at: str
    revoked: bool


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def check_user_name(user: str) -> str:
    if not USER_NAME.match(user):
        raise ValueError(
            f"user name {user!r} is not allowed: use 1-100 letters, digits, '.', '_', '@' or '-', "
            "starting with a letter or digit"
        )
    return user


class TokenStore:
    def __init__(self, store: QueueStore) -> None:
        self._store = store

    def create(self, user: str, *, admin: bool = False) -> tuple[int, str]:
        """Returns (token id, token). The token is shown once; only its hash is kept."""
        check_user_name(user)
        token = PREFIX + secrets.token_urlsafe(32)
        with self._store.session() as s, s.begin():
            row = ApiToken(user=user, token_hash=hash_token(token), prefix=token[:10], admin=admin, created_at=utcnow())
            s.add(row)
            s.flush()
            return row.id, token

    def revoke(self, token_id: int) -> TokenInfo:
        with self._store.session() as s, s.begin():
            row = s.get(ApiToken, token_id)
            if row is None:
                raise KeyError(f"no API token with id {token_id}; `layerlab token list` shows the ids")
            if row.revoked_at is None:
                row.revoked_at = utcnow()
            return _info(row)

    def list(self) -> list[TokenInfo]:
        with self._store.session() as s:
            return [_info(r) for r in s.scalars(select(ApiToken).order_by(ApiToken.id))]

    def authenticate(self, token: str) -> Principal | None:
        if not token.startswith(PREFIX) or len(token) > 200:
            return None
        q = select(ApiToken).where(ApiToken.token_hash == hash_token(token), ApiToken.revoked_at.is_(None))
        with self._store.session() as s:
            row = s.scalars(q).first()
            return Principal(user=row.user, admin=row.admin, token_id=row.id) if row else None


def _info(row: ApiToken) -> TokenInfo:
    return TokenInfo(
        id=row.id,
        user=row.user,
        prefix=row.prefix,
        admin=row.admin,
        created_at=row.created_at.isoformat(timespec="seconds"),
        revoked=row.revoked_at is not None,
    )
