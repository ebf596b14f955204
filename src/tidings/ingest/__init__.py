"""Ingest: bridge frames land in a durable inbox, are decoded into events, and projected.

``events`` holds the closed event union and the identity canonicalisation; ``decoders``
turns one frame payload per codec into those events.
"""
