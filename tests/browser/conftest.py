"""The browser tests: every test here is marked ``browser`` (``make test-browser``).

They drive the distribution's Chromium through its chromedriver with Selenium (the
``browser`` extra). A machine without them fails these tests with what is missing:
``make test-browser`` is asked for explicitly, so a skip would hide that nothing ran.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("STOVEPIPE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("STOVEPIPE_CHROMEDRIVER", "/usr/bin/chromedriver")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.browser)


def _program(path: str, package: str) -> str:
    found = path if os.access(path, os.X_OK) else shutil.which(Path(path).name)
    if not found:
        pytest.fail(
            f"{path} is missing: install the distribution's {package} "
            "(apt-get install -y chromium chromium-driver), or point "
            "STOVEPIPE_CHROMIUM / STOVEPIPE_CHROMEDRIVER at it",
            pytrace=False,
        )
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Headless Chromium, driven through the distribution's chromedriver (never one
    downloaded at run time)."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is missing: pip install -e '.[browser]'", pytrace=False)
    options = webdriver.ChromeOptions()
    options.binary_location = _program(CHROMIUM, "chromium")
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI containers run as root, where the sandbox cannot start
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        "--no-first-run",
        "--disable-extensions",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(
        service=Service(executable_path=_program(CHROMEDRIVER, "chromium-driver")),
        options=options,
    )
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
