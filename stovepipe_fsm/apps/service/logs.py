"""Structured logs: one JSON object per line, so a log pipeline never parses prose.

Every record carries ``level`` and ``message``; records about a queue or a request carry
``queue`` and ``request_id`` (pass them with ``extra=``), so an operator can follow one
request across replicas with a single filter.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import TextIO

CONTEXT_FIELDS = ("queue", "request_id")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, object] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value:
                body[name] = value
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        return json.dumps(body, ensure_ascii=False)


def configure_json_logging(level: int = logging.INFO, stream: TextIO | None = None) -> None:
    """Send the package's logs to ``stream`` (stderr) as JSON lines; idempotent."""
    root = logging.getLogger("stovepipe_fsm")
    for handler in list(root.handlers):
        if getattr(handler, "_stovepipe_json", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler._stovepipe_json = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False
