"""Request dependencies: the queue store and settings, built once per app."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.queue import QueueStore
from service.settings import Settings


def get_store(request: Request) -> QueueStore:
    store: QueueStore = request.app.state.store
    return store


def get_app_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


StoreDep = Annotated[QueueStore, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]
