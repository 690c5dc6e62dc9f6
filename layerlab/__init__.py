"""layerlab's Python client: `from layerlab import Client`. It lives in service/client.py (the CLI is built on
it); this package only names it for notebooks and scripts."""

from service.client import ApiError, Client

__all__ = ["ApiError", "Client"]
