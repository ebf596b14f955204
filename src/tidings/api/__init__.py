"""The HTTP edge (FastAPI): thin handlers that call the synchronous core."""

from .app import create_app

__all__ = ["create_app"]
