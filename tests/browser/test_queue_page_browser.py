"""The queue page and a refused policy edit in headless Chromium at 1280 px wide,
against a real nats-server and a real ``serve`` running the monorepo trial policy.

A serial release queue with a long name holds its second head behind the first (the
front) and a third behind that; the queue page lists them front first with why each
waits, the queue names stay on one line and every table fits the viewport (checked on
the elements' boxes, and on screenshots 1280 px wide). The main queue's culprit search (a
row stored in its bucket, as the search writes it) shows on the overview and its page,
with its probes in flight. Then the config is edited into
one the service refuses: ``/policy`` shows the refused edit with its located error,
``/readyz`` stays ready and says so, and ``status`` prints it.

Screenshots go to ``STOVEPIPE_PAGE_SCREENSHOT``'s directory when it is set, else to the
test's temporary directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from nats_server import connect, isolated_tag
from page_support import WIDTH, boxes_fit, one_line, serving
from test_service_cli import ROOT, cli, http_get, wait_until
from test_status_page_browser import until

from stovepipe_fsm.adapters.jetstream import Topology, open_kv_stores
from stovepipe_fsm.adapters.jetstream.server import free_port
from stovepipe_fsm.domain.culprit_search import CulpritSearch, Probe, Tally

TRIAL = ROOT / "examples" / "policies" / "monorepo_trial"
RELEASE = "mono/release-2026.12-hotfix-candidate"
MAIN = "mono/main"


class Served:
    def __init__(self, port: int, common: list[str], config: Path, shots: Path) -> None:
        self.port, self.common, self.config, self.shots = port, common, config, shots

    def at(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = cli(*args, *self.common)
        assert done.returncode == 0, done.stderr
        return done


@pytest.fixture(scope="module")
def module_tag(nats_server) -> Iterator[str]:  # type: ignore[no-untyped-def]
    yield from isolated_tag(nats_server, "q")


@pytest.fixture(scope="module")
def served(nats_server, module_tag, tmp_path_factory) -> Iterator[Served]:  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("queue-page")
    shutil.copytree(TRIAL / "machines", root / "machines")
    config = yaml.safe_load((TRIAL / "config" / "queues.yaml").read_text())
    config["defaults"]["gate_wait_delay_ms"] = 200
    (root / "queues.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    wanted = os.environ.get("STOVEPIPE_PAGE_SCREENSHOT")
    shots = Path(wanted).parent if wanted else root / "shots"
    shots.mkdir(parents=True, exist_ok=True)
    common = ["--nats", nats_server.url, "--topology-tag", module_tag]
    policy = ["--machines", str(root / "machines"), "--config", str(root / "queues.yaml")]
    port = free_port()
    with serving([*common, *policy], port):
        page = Served(port, [*common, *policy], root / "queues.yaml", shots)

        def state(uri: str) -> str:
            doc = json.loads(page.run("status", "--json", "--all").stdout)
            return {r["uri"]: r["state"] for r in doc["requests"]}.get(uri, "")

        page.run("ingest", "--queue", MAIN, "--uri", "M1")
        for uri in ("R1", "R2", "R3"):
            page.run("ingest", "--queue", RELEASE, "--uri", uri)
        wait_until(lambda: state("R1") == "processing", "R1 processing")
        wait_until(lambda: state("M1") == "processing", "M1 processing")
        yield page


BLAMELIST = tuple(str(n) * 40 for n in range(1, 8))
PROBES = (Probe(f"request/{MAIN}/20", BLAMELIST[1]), Probe(f"request/{MAIN}/21", BLAMELIST[4]))


def store_search(server: Any, tag: str) -> None:
    """A search of MAIN's red head M1 with two probes in flight, as the search writes it."""
    search = CulpritSearch(
        MAIN,
        state="searching",
        red_request_id=f"request/{MAIN}/1",
        base_uri="0" * 40,
        blamelist=BLAMELIST,
        tallies=(*[Tally()] * 6, Tally(reds=1)),
        probes=PROBES,
        probes_started=2,
    )

    async def write() -> None:
        nc = await connect(server)
        try:
            await (await open_kv_stores(nc.jetstream(), Topology.isolated(tag))).searches.create(
                search
            )
        finally:
            await nc.close()

    asyncio.run(write())


def at_width(browser: Any) -> None:
    """A 1280 CSS px wide viewport at one device pixel per CSS pixel."""
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": WIDTH, "height": 1000, "deviceScaleFactor": 1, "mobile": False},
    )


def shot(browser: Any, served: Served, name: str) -> Path:
    path = served.shots / f"{name}.png"
    assert browser.save_screenshot(str(path)), path
    width, _ = struct.unpack(">II", path.read_bytes()[16:24])  # the PNG's IHDR
    assert width == WIDTH, (path, width)
    return path


def test_the_queue_page_lists_the_heads_front_first_and_fits_1280_px(  # type: ignore[no-untyped-def]
    browser, served, nats_server, module_tag
) -> None:
    from selenium.webdriver.common.by import By

    store_search(nats_server, module_tag)
    at_width(browser)
    browser.get(served.at("/"))
    until(lambda: browser.find_elements(By.CSS_SELECTOR, "tr.queue"), "the queue rows", 10)
    names = browser.find_elements(By.CSS_SELECTOR, "#queues .queue-name")
    assert {n.text for n in names} >= {RELEASE, MAIN}
    assert one_line(browser, names), "a queue name wraps on the overview"
    assert boxes_fit(browser, "#queues"), "the queue table is wider than the viewport"
    search = browser.find_element(By.CSS_SELECTOR, f'tr[data-queue="{MAIN}"] .search').text
    assert search == "culprit search for red head M1: searching; probes 2 in flight", search
    shot(browser, served, "overview-1280")

    link = browser.find_element(By.CSS_SELECTOR, f'a[href="/queue/{RELEASE}"]')
    link.click()
    until(lambda: browser.find_elements(By.ID, "heads"), "the waiting heads", 10)
    assert browser.current_url.endswith(f"/queue/{RELEASE}")

    def heads() -> list[list[str]]:
        rows = browser.find_elements(By.CSS_SELECTOR, "#heads tr.head")
        return [[c.text for c in r.find_elements(By.TAG_NAME, "td")] for r in rows]

    # R2 is at the front, held while R1 builds; R3 waits behind it, never delivered yet.
    shown = until(lambda: (h := heads()) and "gate_closed" in h[0][4] and h, "R2 held", 15)
    assert [(row[0], row[1], row[3]) for row in shown] == [
        ("1", "R2", "accepted"),
        ("2", "R3", "accepted"),
    ]
    assert "behind the front" in shown[1][4]
    facts = browser.find_element(By.ID, "queue-facts").text
    assert "last green" in facts and "none yet" in facts
    holders = browser.find_element(By.ID, "holders").text
    assert "R1" in holders and f"request/{RELEASE}/1" in holders
    parameters = {
        row.find_element(By.TAG_NAME, "th").text: row.find_element(By.TAG_NAME, "td").text
        for row in browser.find_elements(By.CSS_SELECTOR, "#parameters tr")
    }
    assert parameters["every_head"] == "true" and parameters["max_concurrent"] == "1"
    assert parameters["full_build_paths"] == "[WORKSPACE, **/BUILD.bazel, .bazelrc]"
    assert parameters["skip_paths"] == "[docs/**]"
    assert "admitted: full build (why full: " in browser.find_element(By.ID, "queue-decisions").text
    title = browser.find_elements(By.ID, "queue-name")
    assert one_line(browser, title) and title[0].text == RELEASE
    for table in ("#heads", "#holders", "#parameters", "#queue-decisions"):
        assert boxes_fit(browser, table), f"{table} is wider than the viewport"
    shot(browser, served, "queue-1280")

    # The main queue's page: its search, and the probes in flight for its red head.
    browser.get(served.at(f"/queue/{MAIN}"))
    until(lambda: browser.find_elements(By.ID, "probes"), "the probes in flight", 10)
    probes = [
        [c.text for c in row.find_elements(By.TAG_NAME, "td")]
        for row in browser.find_elements(By.CSS_SELECTOR, "#probes tr.probe")
    ]
    assert probes == [
        [BLAMELIST[1][:10], PROBES[0].request_id, f"request/{MAIN}/1"],
        [BLAMELIST[4][:10], PROBES[1].request_id, f"request/{MAIN}/1"],
    ]
    facts = browser.find_element(By.ID, "queue-facts").text
    assert (
        "red head M1: culprit search searching (blamelist 7 commit(s); "
        "green through the base, red from position 7; 2 probe(s) started, 2 in flight)"
    ) in facts, facts
    for table in ("#queue-facts", "#probes"):
        assert boxes_fit(browser, table), f"{table} is wider than the viewport"
    shot(browser, served, "queue-probes-1280")

    # explain says the same of R3: where it stands, behind whom.
    explained = served.run("explain", "--queue", RELEASE, "--uri", "R3").stdout
    assert "now: waiting 2nd behind R2 (request 2) at the front (held: gate_closed)" in (
        explained
    ), explained


def test_a_refused_edit_shows_on_the_policy_page_readyz_and_status(browser, served) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    at_width(browser)
    good = served.config.read_text()
    bad = yaml.safe_load(good)
    bad["queues"][MAIN]["max_concurrent"] = -1
    served.config.write_text(yaml.safe_dump(bad, sort_keys=False))
    try:
        browser.get(served.at("/policy"))

        def refused() -> Any:
            browser.get(served.at("/policy"))
            found = browser.find_elements(By.CSS_SELECTOR, '#refused[data-now="true"]')
            return found[0] if found else None

        box = until(refused, "the refused edit on /policy", 15)
        assert "Last refused edit (config)" in box.text
        assert "queues.yaml:" in box.text and "max_concurrent" in box.text, box.text
        assert "max_concurrent: 2" in browser.find_element(By.ID, "config").text  # in force
        assert boxes_fit(browser, "#policy-loads") and boxes_fit(browser, "#refused")
        shot(browser, served, "policy-refused-1280")
        status, body = http_get(served.port, "/readyz")
        assert status == 200 and body.startswith("ready\n- policy edit refused (config)"), body
        text = served.run("status").stdout
        assert "last refused edit (config) at " in text and "not in force:" in text, text
    finally:
        served.config.write_text(good)
