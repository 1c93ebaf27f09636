"""File adapters: configuration read from files on the local disk."""

from .config_store import FileConfigStore, FileStamp, MonotonicClock

__all__ = ["FileConfigStore", "FileStamp", "MonotonicClock"]
