"""Layout checks on element boxes in the browser: one line, within the viewport."""

from __future__ import annotations

from typing import Any

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
