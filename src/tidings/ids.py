"""Server-minted identifiers: a short kind prefix plus 128 random bits, as lowercase hex.

The prefix makes an id self-describing in logs and URLs (``msg_…``, ``ch_…``); the random
part makes ids unguessable, so knowing one id never lets a caller derive another.
"""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"
