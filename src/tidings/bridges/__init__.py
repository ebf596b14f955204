"""Bridges meet channels: links from bridge conversations into hub channels."""
