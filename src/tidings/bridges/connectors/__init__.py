"""Connectors: bridge processes that ship with Tidings (signal-cli today)."""
