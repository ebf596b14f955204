"""Small helpers shared by test modules (import as ``from helpers import ...``)."""

from __future__ import annotations


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
