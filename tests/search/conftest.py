"""Search tests reuse the projection world of tests/ingest."""

import sys
from pathlib import Path

_INGEST = str(Path(__file__).resolve().parent.parent / "ingest")
if _INGEST not in sys.path:
    sys.path.insert(0, _INGEST)
