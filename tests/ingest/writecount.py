"""Row-write counting for the tests: moved to ``tidings.replay.writecount`` (the replay
harness uses the same technique); re-exported here so existing imports keep working."""

from tidings.replay.writecount import COUNT_TABLE, OPS, WriteCounter

__all__ = ["COUNT_TABLE", "OPS", "WriteCounter"]
