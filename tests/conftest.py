"""Shared fixtures: the real-broker fixtures live in ``tests/nats_server.py``."""

from nats_server import js_env, nats_server

__all__ = ["js_env", "nats_server"]
