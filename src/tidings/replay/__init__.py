"""Replay harness and synthetic corpus generation (issue 5; CONTRACT §1, §6)."""
