"""Culprit finding on in-memory ports: the search machine run by record for each ended
build, through the same stages the service builds.

A linear trunk ``c1 .. c9`` after a green base ``c0``; coalescing validates only the
newest head, which goes red. The blamelist is every commit after the base; probes build
them in the probe slots; the culprit is named with its green parent, and announced.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from memory_stages import memory_stages, settled

from stovepipe_fsm.adapters.memory import (
    MemoryDelivery,
    MemoryPublisher,
    MemorySearchStore,
    MemorySourceControl,
    MemorySourceControlProvider,
)
from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.adapters.memory.decision_trail import MemoryTrail
from stovepipe_fsm.domain.entities import Request
from stovepipe_fsm.domain.errors import IllegalOperation, NotFound
from stovepipe_fsm.domain.hooks import CULPRIT_FOUND, CULPRIT_UNRESOLVED
from stovepipe_fsm.domain.trail_record import CULPRIT
from stovepipe_fsm.pipeline.verbs import retry
from stovepipe_fsm.process.catalog import load_process_machines

ROOT = Path(__file__).resolve().parent.parent
MACHINES = load_process_machines(ROOT / "machines")
Q = "monorepo/main"
BASE = "c0"


class Trunk:
    """Stages over a linear history with culprit finding on."""

    def __init__(
        self, commits: int, trail: MemoryTrail | None = None, **parameters: object
    ) -> None:
        self.commits = [f"c{i}" for i in range(commits + 1)]
        source = MemorySourceControl(
            {c: ([self.commits[i - 1]] if i else []) for i, c in enumerate(self.commits)}
        )
        self.publisher = MemoryPublisher()
        self.searches = MemorySearchStore()
        config = StaticConfigStore(
            {"defaults": {"probe_slots": 1, **parameters}},
            parameters=MACHINES.parameters,
        )
        self.stages = memory_stages(
            MACHINES,
            publisher=self.publisher,
            searches=self.searches,
            config=config,
            source_control=MemorySourceControlProvider(default=source),
            **({"trail": trail} if trail is not None else {}),
        )
        self.requests = self.stages.services.requests

    async def head(self, uri: str) -> Request:
        """Ingest ``uri`` and let process decide on every head waiting."""
        result = await self.stages.ingest.ingest(Q, uri)
        await settled(self.stages.controller, MemoryDelivery(Q, result.request_id))
        return await self.requests.get(result.request_id)

    def builds(self) -> list[str]:
        return [p.request_id for p in self.publisher.builds()]

    def hooks(self, kind: str) -> list[dict[str, str]]:
        return [p.event().payload for p in self.publisher.hooks() if p.event_type == kind]

    async def run_probes(self, culprit: str, flaky: frozenset[str] = frozenset()) -> int:
        """Report every probe build published and not ended: red at and after
        ``culprit`` (and once for each commit in ``flaky``), green before. Returns how
        many probe builds ran."""
        ran = 0
        flakes = set(flaky)
        while True:
            waiting = [
                r
                for r in (await self.requests.get_many(self.builds())).values()
                if r.probe_of and not self.stages.lifecycle.is_terminal(r)
            ]
            if not waiting:
                return ran
            for probe in waiting:
                ran += 1
                red = self.commits.index(probe.uri) >= self.commits.index(culprit)
                if probe.uri in flakes:
                    flakes.discard(probe.uri)
                    red = True
                await self.stages.record.complete(probe.id, "failed" if red else "succeeded")


async def green_base(trunk: Trunk) -> None:
    first = await trunk.head(BASE)
    await trunk.stages.record.complete(first.id, "succeeded")


async def red_burst(trunk: Trunk, head: str) -> Request:
    """A green base, then every commit of the trunk pushed at once: coalescing admits
    ``head`` alone, and its build goes red (returned as recorded)."""
    await green_base(trunk)
    for commit in trunk.commits[1:]:
        await trunk.stages.ingest.ingest(Q, commit)
    red = await trunk.head(head)
    return await trunk.stages.record.complete(red.id, "failed")


@pytest.mark.parametrize("slots", [1, 2, 4])
async def test_a_red_head_finds_the_middle_commit_that_broke_it(slots: int) -> None:
    trunk = Trunk(9, probe_slots=slots)
    red = await red_burst(trunk, "c9")
    assert red.base_uri == BASE

    ran = await trunk.run_probes(culprit="c5")

    [found] = trunk.hooks(CULPRIT_FOUND)
    assert (found["culprit"], found["green_parent"], found["request_id"]) == ("c5", "c4", red.id)
    assert int(found["reds"]) >= 2
    assert 0 < ran <= 9
    search = await trunk.searches.get(Q)
    assert (search.state, search.culprit, search.probes) == ("named", "c5", ())
    # Probes never moved latest and never took a build slot; no validation event for them.
    queue = await trunk.stages.services.queues.get(Q)
    assert queue.latest_request_id == red.id and queue.slot_holders == ()
    probe_ids = {
        r.id for r in (await trunk.requests.get_many(trunk.builds())).values() if r.probe_of
    }
    validations = {p.request_id for p in trunk.publisher.hooks() if "culprit" not in p.event_type}
    assert not probe_ids & validations


async def test_the_green_parent_found_by_a_probe_is_a_recorded_green() -> None:
    trunk = Trunk(9, probe_slots=1)
    await red_burst(trunk, "c9")
    await trunk.run_probes(culprit="c5")
    queue = await trunk.stages.services.queues.get(Q)
    assert queue.greens[0].uri == "c4", "the highest green probe is the newest green"


async def test_a_flaky_red_below_the_culprit_is_not_named() -> None:
    trunk = Trunk(9, probe_slots=1, confirm_reds=2)
    await red_burst(trunk, "c9")
    await trunk.run_probes(culprit="c7", flaky=frozenset({"c4", "c5"}))
    [found] = trunk.hooks(CULPRIT_FOUND)
    assert found["culprit"] == "c7"


async def test_a_red_head_that_does_not_reproduce_is_unresolved() -> None:
    """The head's red was a flake: its rerun is green, so no commit is named."""
    trunk = Trunk(3, probe_slots=1)
    red = await red_burst(trunk, "c3")
    trunk.commits.append("never")  # no commit of the trunk is broken
    await trunk.run_probes(culprit="never")
    [unresolved] = trunk.hooks(CULPRIT_UNRESOLVED)
    assert (unresolved["reason"], unresolved["request_id"]) == ("red_not_reproduced", red.id)
    assert not trunk.hooks(CULPRIT_FOUND)


async def test_finding_off_starts_no_search() -> None:
    trunk = Trunk(3, probe_slots=0)
    await green_base(trunk)
    red = await trunk.head("c3")
    await trunk.stages.record.complete(red.id, "failed")
    assert trunk.builds() == [f"request/{Q}/1", red.id]
    with pytest.raises(NotFound):
        await trunk.searches.get(Q)


async def test_a_repeated_outcome_starts_no_second_probe() -> None:
    trunk = Trunk(9, probe_slots=2)
    await green_base(trunk)
    red = await trunk.head("c9")
    await trunk.stages.record.complete(red.id, "failed")
    first, started = set(trunk.builds()), (await trunk.searches.get(Q)).probes_started
    assert started == 2
    await trunk.stages.record.complete(red.id, "failed")
    assert set(trunk.builds()) == first, "a repeat republishes (deduped), never a new probe"
    assert (await trunk.searches.get(Q)).probes_started == started


PLUGIN = '''
from stovepipe_fsm.plugin import PluginRegistry, SearchView


def register(plugin: PluginRegistry) -> None:
    @plugin.culprit.condition(parameters=["probe_slots"])
    def off_or_release_commit(view: SearchView) -> bool:
        """probe_slots is 0, or the red head is a release commit (no search for it)."""
        return view.param("probe_slots") == 0 or view.ended.uri.startswith("release")
'''


async def test_a_plugin_condition_decides_in_the_culprit_machine(tmp_path: Path) -> None:
    """A policy swaps the built-in ``finding_off`` for its own plugin condition: the
    search machine asks it through the same vocabulary as the gate's plugins."""
    machines = tmp_path / "machines"
    machines.mkdir()
    for name in ("request.yaml", "queue_gate.yaml"):
        (machines / name).write_bytes((ROOT / "machines" / name).read_bytes())
    culprit = (ROOT / "machines" / "culprit.yaml").read_text(encoding="utf-8")
    culprit = culprit.replace("finding_off", "off_or_release_commit")
    culprit = culprit.replace(
        "initial: received\n", "initial: received\nplugins: [no_release_search]\n"
    )
    (machines / "culprit.yaml").write_text(culprit, encoding="utf-8")
    (tmp_path / "no_release_search.py").write_text(PLUGIN, encoding="utf-8")
    policy = load_process_machines(machines)
    assert policy.culprit is not None
    assert policy.culprit.registry.conditions["off_or_release_commit"].origin

    for head, searched in (("release-9", False), ("c9", True)):
        trunk = Trunk(9, probe_slots=1)
        trunk.stages = memory_stages(
            policy,
            publisher=trunk.publisher,
            searches=trunk.searches,
            config=StaticConfigStore(
                {"defaults": {"probe_slots": 1}}, parameters=policy.parameters
            ),
            source_control=trunk.stages.services.source_control,
        )
        trunk.requests = trunk.stages.services.requests
        trunk.commits.append(head)
        trunk.stages.services.source_control.for_queue(Q).add_commit(head, ["c8"])  # type: ignore[union-attr]
        await green_base(trunk)
        red = await trunk.head(head)
        await trunk.stages.record.complete(red.id, "failed")
        started = [
            r for r in (await trunk.requests.get_many(trunk.builds())).values() if r.probe_of
        ]
        assert bool(started) is searched, head


async def test_a_probe_is_never_retried_as_a_head() -> None:
    """A failed probe is not a head: retrying it would ingest an old commit as the
    newest and move trunk validation backwards."""
    trunk = Trunk(9, probe_slots=1)
    await green_base(trunk)
    red = await trunk.head("c9")
    await trunk.stages.record.complete(red.id, "failed")
    [probe] = (await trunk.searches.get(Q)).probes
    await trunk.stages.record.complete(probe.request_id, "failed")
    with pytest.raises(IllegalOperation, match="probe build of the culprit search"):
        await retry(
            trunk.stages.lifecycle,
            trunk.stages.ingest,
            trunk.stages.ingest.uri_index,
            probe.request_id,
        )
    assert (await trunk.stages.services.queues.get(Q)).latest_request_id == red.id


async def test_a_probe_nobody_reports_frees_its_slot_after_the_lease() -> None:
    """With max_validation_ms, a probe build never reported is taken as lost when the
    next search starts: its slot is free again, and its late result changes nothing."""
    trunk = Trunk(9, probe_slots=1, max_validation_ms=60_000, gate_wait_delay_ms=1000)
    clock = trunk.stages.services.clock
    await green_base(trunk)
    first = await trunk.head("c4")
    await trunk.stages.record.complete(first.id, "failed")
    [lost] = (await trunk.searches.get(Q)).probes
    clock.advance(61_000)  # type: ignore[attr-defined]
    second = await trunk.head("c9")
    await trunk.stages.record.complete(second.id, "failed")
    search = await trunk.searches.get(Q)
    assert search.red_request_id == second.id
    assert [p.request_id for p in search.probes] != [lost.request_id]
    assert len(search.probes) == 1, "the lost probe's slot went to the new search"
    await trunk.stages.record.complete(lost.request_id, "succeeded")
    assert (await trunk.searches.get(Q)).probes == search.probes


def test_the_culprit_page_shows_the_generated_diagram() -> None:
    """docs/culprits.md embeds the diagram ``diagram`` generates, as it is now."""

    def mermaid(path: Path) -> str:
        text = path.read_text(encoding="utf-8")
        start = text.index("```mermaid\n")
        return text[start : text.index("```\n", start + 1) + 4]

    docs = ROOT / "docs"
    assert mermaid(docs / "culprits.md") == mermaid(docs / "diagrams" / "culprit.md")


async def test_a_search_replaced_by_a_newer_red_head_says_so_on_its_red_heads_trail() -> None:
    trail = MemoryTrail()
    trunk = Trunk(9, trail=trail, probe_slots=1)
    await green_base(trunk)
    first = await trunk.head("c5")
    await trunk.stages.record.complete(first.id, "failed")
    second = await trunk.head("c9")
    await trunk.stages.record.complete(second.id, "failed")
    told = [
        (r.details["state"], r.details.get("reason", ""))
        for r in await trail.history(first.id)
        if r.kind == CULPRIT
    ]
    assert told[-1] == ("unresolved", "newer red head"), told
    assert (await trunk.searches.get(Q)).red_request_id == second.id
