"""What the browser tests share: a ``serve`` with its HTTP port for the length of a
fixture, and layout checks on element boxes (one line, within the viewport)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

from test_service_cli import CLI, ROOT, TIMEOUT_S, http_get, wait_until

#: The width the layout tests look at the pages with (CSS px, one device px each).
WIDTH = 1280


def one_line(browser: Any, elements: list[Any]) -> bool:
    """Every element (inline: a queue name) is laid out on a single line box."""
    counts = browser.execute_script(
        "return arguments[0].map(e => e.getClientRects().length)", elements
    )
    return bool(elements) and all(count == 1 for count in counts)


def boxes_fit(browser: Any, selector: str) -> bool:
    """The element and the page fit the viewport's width: nothing scrolls sideways."""
    return bool(
        browser.execute_script(
            "const e = document.querySelector(arguments[0]);"
            "const r = e.getBoundingClientRect();"
            "return r.left >= 0 && r.right <= window.innerWidth"
            " && document.documentElement.scrollWidth <= window.innerWidth;",
            selector,
        )
    )


@contextlib.contextmanager
def serving(args: list[str], port: int) -> Iterator[None]:
    """``serve ARGS --http-port PORT`` until the block ends, once ``/healthz`` answers;
    then stopped with SIGTERM, and it must exit 0."""
    serve = subprocess.Popen(
        [*CLI, "serve", *args, "--http-port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        wait_until(lambda: http_get(port, "/healthz")[0] == 200, "healthz 200")
        yield
    finally:
        serve.send_signal(signal.SIGTERM)
        _, err = serve.communicate(timeout=TIMEOUT_S)
        assert serve.returncode == 0, err[-2000:]
