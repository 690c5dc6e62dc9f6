"""API tokens: created and revoked by an operator (`layerlab token ...`), checked on every request.

A token is `ll_` + 32 random bytes (URL-safe base64). The database keeps its SHA-256 only: the token
has 256 bits of entropy, so a fast hash is enough (no salt or key stretching needed), and a lookup by
hash is one indexed query. An API process keeps the tokens it has checked for `cache_seconds`
(LAYERLAB_TOKEN_CACHE_SECONDS), so a busy client costs no query per request; a revoked token stops
working within that time (at once in the process that revoked it).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
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


CACHE_LIMIT = 10_000
"""Checked tokens one process keeps; past it the cache starts again (a bound against token sprays)."""


class TokenStore:
    def __init__(self, store: QueueStore, *, cache_seconds: float = 0.0) -> None:
        self._store = store
        self._cache_seconds = cache_seconds
        self._cache: dict[str, tuple[Principal, float]] = {}  # token hash -> (principal, valid until)

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
            info = _info(row)
        self._cache = {h: hit for h, hit in self._cache.items() if hit[0].token_id != token_id}
        return info

    def list(self) -> list[TokenInfo]:
        with self._store.session() as s:
            return [_info(r) for r in s.scalars(select(ApiToken).order_by(ApiToken.id))]

    def cached(self, token: str) -> Principal | None:
        """The principal of a token checked less than `cache_seconds` ago; None: ask `authenticate`."""
        hit = self._cache.get(hash_token(token))
        return hit[0] if hit is not None and hit[1] > time.monotonic() else None

    def authenticate(self, token: str) -> Principal | None:
        if not token.startswith(PREFIX) or len(token) > 200:
            return None
        digest = hash_token(token)
        q = select(ApiToken).where(ApiToken.token_hash == digest, ApiToken.revoked_at.is_(None))
        with self._store.session() as s:
            row = s.scalars(q).first()
            principal = Principal(user=row.user, admin=row.admin, token_id=row.id) if row else None
        if principal is not None and self._cache_seconds > 0:  # unknown tokens are not kept: a spray cannot fill it
            if len(self._cache) >= CACHE_LIMIT:
                self._cache = {}
            self._cache[digest] = (principal, time.monotonic() + self._cache_seconds)
        return principal


def _info(row: ApiToken) -> TokenInfo:
    return TokenInfo(
        id=row.id,
        user=row.user,
        prefix=row.prefix,
        admin=row.admin,
        created_at=row.created_at.isoformat(timespec="seconds"),
        revoked=row.revoked_at is not None,
    )
