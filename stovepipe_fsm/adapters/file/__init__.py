"""File adapters: configuration read from files on the local disk."""

from .config_store import FileConfigStore

__all__ = ["FileConfigStore"]
