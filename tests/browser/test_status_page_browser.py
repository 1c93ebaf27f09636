"""The status page in headless Chromium, against a real nats-server and a real ``serve``.

The page loads and shows a queue ingested into; a ``pause`` shows within one refresh of
the page (which refreshes itself: the test never reloads it); the request view shows
the explain history; hostile strings render as text and run nothing.

A queue name cannot hold ``<script>``: ``>`` is a subject wildcard, which the queue-name
rule refuses. So the hostile queue is ``team/<script`` and the full ``<script>`` element
travels in what a user may put there: a commit uri and a pause reason.

With ``STOVEPIPE_PAGE_SCREENSHOT=<file>.png`` the overview is saved there (and the
request and policy pages beside it, ``<file>-request.png``, ``<file>-policy.png``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from nats_server import isolated_tag
from page_support import serving
from test_service_cli import cli, wait_until

from stovepipe_fsm.adapters.jetstream.server import free_port
from stovepipe_fsm.views.page import REFRESH_S

QUEUE = "team/app"
HOSTILE_QUEUE = "team/<script"
HOSTILE_URI = "<script>window.stovepipeInjected=1</script>"
HOSTILE_IMG = "<img/src=x/onerror=window.stovepipeInjected=2>"
HOSTILE_REASON = "<script>window.stovepipeInjected=3</script>"


class Page:
    """A running ``serve`` with its HTTP port, and the operator commands' common flags."""

    def __init__(self, url: str, tag: str, port: int, common: list[str]) -> None:
        self.url, self.tag, self.port, self.common = url, tag, port, common

    def at(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def run(self, *args: str) -> dict[str, Any]:
        done = cli(*args, *self.common)
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))


@pytest.fixture(scope="module")
def module_tag(nats_server) -> Iterator[str]:  # type: ignore[no-untyped-def]
    yield from isolated_tag(nats_server, "b")


@pytest.fixture(scope="module")
def served(nats_server, module_tag, tmp_path_factory) -> Iterator[Page]:  # type: ignore[no-untyped-def]
    config = tmp_path_factory.mktemp("page") / "queues.yaml"
    config.write_text("defaults: {gate_wait_delay_ms: 200}\nqueues: {}\n", encoding="utf-8")
    common = ["--nats", nats_server.url, "--topology-tag", module_tag, "--config", str(config)]
    port = free_port()
    with serving(common, port):
        page = Page(nats_server.url, module_tag, port, common)
        page.run("ingest", "--queue", QUEUE, "--uri", "A")

        def processing(uri: str) -> bool:
            doc = page.run("status", "--json")
            return {r["uri"]: r["state"] for r in doc["requests"]}.get(uri) == "processing"

        # B after A was admitted: B waits behind A (a hold), rather than superseding it.
        wait_until(lambda: processing("A"), "A processing")
        page.run("ingest", "--queue", QUEUE, "--uri", "B")
        page.run("ingest", "--queue", HOSTILE_QUEUE, "--uri", HOSTILE_URI)
        wait_until(lambda: processing(HOSTILE_URI), "the hostile uri processing")
        page.run("ingest", "--queue", HOSTILE_QUEUE, "--uri", HOSTILE_IMG)
        yield page


def until(check: Callable[[], Any], what: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
        except Exception:  # the page is being reloaded: its elements went stale
            result = None
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.1)


def queue_row(browser: Any, name: str) -> Any:
    from selenium.webdriver.common.by import By

    for row in browser.find_elements(By.CSS_SELECTOR, "tr.queue"):
        if row.get_attribute("data-queue") == name:
            return row
    return None


def screenshot(browser: Any, suffix: str = "") -> None:
    wanted = os.environ.get("STOVEPIPE_PAGE_SCREENSHOT")
    if wanted:
        path = Path(wanted)
        if suffix:
            path = path.with_name(f"{path.stem}-{suffix}{path.suffix or '.png'}")
        path.parent.mkdir(parents=True, exist_ok=True)
        assert browser.save_screenshot(str(path)), path


def test_the_page_shows_the_queue_a_test_ingested_into(browser, served: Page) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    browser.get(served.at("/"))
    row = until(lambda: queue_row(browser, QUEUE), "the team/app row", 10)
    assert row.find_element(By.CSS_SELECTOR, ".queue-name").text == QUEUE
    assert "request/team/app/1" in row.text  # A holds the slot
    assert "B for" in row.text  # B is the oldest waiting head
    assert "max_concurrent=1" in row.text
    assert browser.find_element(By.CSS_SELECTOR, ".policy-hash").text not in ("", "unknown")
    decisions = browser.find_element(By.ID, "decisions").text
    assert "ingested A" in decisions


def test_a_pause_shows_within_one_refresh_of_the_page(browser, served: Page) -> None:  # type: ignore[no-untyped-def]
    browser.get(served.at("/"))
    row = until(lambda: queue_row(browser, QUEUE), "the team/app row", 10)
    assert row.get_attribute("data-paused") == "false"
    # Set on this load of the page only: gone once the page has reloaded itself.
    browser.execute_script("window.stovepipeLoad = 'before the pause'")
    served.run("pause", QUEUE, "--reason", HOSTILE_REASON)
    paused_at = time.monotonic()

    def shows_paused() -> bool:
        found = queue_row(browser, QUEUE)
        return bool(found) and found.get_attribute("data-paused") == "true"

    until(shows_paused, "the pause on the page", REFRESH_S + 3)
    took = time.monotonic() - paused_at
    print(f"\nstatus page: pause shown {took:.1f} s after the command (refresh {REFRESH_S} s)")
    assert browser.execute_script("return window.stovepipeLoad") is None, "not reloaded"
    row = queue_row(browser, QUEUE)
    assert "paused" in row.text
    pauses = browser.find_element("id", "pauses").text
    assert HOSTILE_REASON in pauses  # the reason, as text
    assert browser.execute_script("return window.stovepipeInjected") is None
    screenshot(browser)


def test_the_request_view_shows_the_explain_history(browser, served: Page) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    browser.get(served.at("/"))
    link = until(
        lambda: browser.find_element(By.CSS_SELECTOR, 'a[href="/request/request/team/app/1"]'),
        "a link to request/team/app/1",
        10,
    )
    link.click()
    until(lambda: browser.find_elements(By.ID, "history"), "the history", 10)
    assert browser.current_url.endswith("/request/request/team/app/1")
    kinds = [
        item.get_attribute("data-kind")
        for item in browser.find_elements(By.CSS_SELECTOR, "#history li.decision")
    ]
    assert kinds[0] == "ingested" and "admitted" in kinds, kinds
    explained = cli("explain", "request/team/app/1", "--json", *served.common)
    assert explained.returncode == 0, explained.stderr
    sentences = [entry["sentence"] for entry in json.loads(explained.stdout)["history"]]
    shown = browser.find_element(By.ID, "history").text
    assert all(sentence in shown for sentence in sentences), (sentences, shown)
    assert browser.find_element(By.ID, "request").text.count("processing") == 1
    screenshot(browser, "request")


def test_hostile_names_and_uris_render_as_text_and_run_nothing(browser, served: Page) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    browser.get(served.at("/"))
    row = until(lambda: queue_row(browser, HOSTILE_QUEUE), "the team/<script row", 10)
    assert row.find_element(By.CSS_SELECTOR, ".queue-name").text == HOSTILE_QUEUE
    body = browser.find_element(By.TAG_NAME, "body").text
    assert f"ingested {HOSTILE_URI}" in body and f"ingested {HOSTILE_IMG}" in body
    assert browser.find_elements(By.TAG_NAME, "script") == []
    assert browser.find_elements(By.TAG_NAME, "img") == []
    assert browser.execute_script("return window.stovepipeInjected") is None
    # The request view of the hostile queue: its uri as text too.
    browser.get(served.at("/request/request/team/%3Cscript/1"))
    until(lambda: browser.find_elements(By.ID, "history"), "the history", 10)
    assert HOSTILE_URI in browser.find_element(By.ID, "request").text
    assert browser.find_elements(By.TAG_NAME, "script") == []
    assert browser.execute_script("return window.stovepipeInjected") is None
    # The filter box is a plain GET form: a hostile filter is echoed as text.
    browser.get(served.at("/"))
    box = browser.find_element(By.NAME, "q")
    box.send_keys(HOSTILE_URI)
    box.submit()
    until(lambda: "q=" in browser.current_url, "the filtered page", 10)
    assert browser.find_element(By.NAME, "q").get_attribute("value") == HOSTILE_URI
    assert browser.execute_script("return window.stovepipeInjected") is None


def test_the_policy_page_shows_the_hash_and_the_diagrams(browser, served: Page) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    browser.get(served.at("/policy"))
    recorded = served.run("status", "--json")["policy"]["hash"]
    assert browser.find_element(By.ID, "policy-hash").text == recorded
    for machine in ("request", "queue_gate", "culprit"):  # the shipped policy's three
        section = browser.find_element(By.ID, f"machine-{machine}")
        assert section.text == machine
    drawn = browser.find_elements(By.CSS_SELECTOR, ".diagram svg")
    sources = browser.find_elements(By.CSS_SELECTOR, "pre.mermaid-source")
    assert len(drawn) + len(sources) == 3  # SVG where Graphviz is installed, else Mermaid
    assert all(s.text.startswith("stateDiagram-v2") for s in sources)
    screenshot(browser, "policy")
