"""Replay harness and synthetic corpus generation (docs/api.md §1, §8.3)."""
