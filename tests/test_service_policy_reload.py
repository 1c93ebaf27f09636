"""``serve`` takes up an edited machines directory without a restart, on a real broker.

The service runs on a copy of the tests' policy with a config that leaves
``max_concurrent`` to the machine's declared default (1). Raising that default in
``queue_gate.yaml`` under the running service is a new behaviour one can see: a second
head is admitted beside the first instead of held. A broken edit, or one that removes a
request state, leaves the policy in force, says why, and keeps the hash.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fixture_policy import GATE_YAML, REQUEST_YAML, copy_policy
from nats_server import connect
from test_located_yaml import counted_values
from test_service_support import FAST, WAIT_S, Events, Running, memory_provider, wait_for

from stovepipe_fsm.adapters.jetstream.policy_record import read_policy_record
from stovepipe_fsm.apps.service.http import render_metrics
from stovepipe_fsm.apps.service.operators import status_document
from stovepipe_fsm.apps.service.policy import PolicyReloader
from stovepipe_fsm.apps.service.service_options import ServiceOptions
from stovepipe_fsm.apps.service.supervisor import Service
from stovepipe_fsm.located.yaml_source import MAX_VALUES

QUEUE = "team/app"
CONFIG = "defaults: {gate_wait_delay_ms: 100}\n"
ONE_SLOT = "    minimum: 1\n    maximum: 1000\n    default: 1\n"
TWO_SLOTS = "    minimum: 1\n    maximum: 1000\n    default: 2\n"
CANCELLED = (
    "  withdraw: withdraw         # an operator's cancel ends a waiting head (optional role)\n",
    "  cancelled: {trigger: cancel}\n",
    "  - name: cancelled\n    terminal: true\n"
    "    description: build cancelled, or a waiting head withdrawn by an operator\n",
    "  - trigger: cancel\n    source: processing\n    dest: cancelled\n"
    "    description: record - build cancelled\n",
    "  - trigger: withdraw\n    source: accepted\n    dest: cancelled\n"
    "    description: an operator cancels a head still waiting (never a running one)\n",
)


def policy_copy(root: Path) -> Path:
    policy = copy_policy(root)
    (policy / "config" / "queues.yaml").write_text(CONFIG)
    assert ONE_SLOT in (policy / "machines" / GATE_YAML.name).read_text()
    return policy


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


@contextlib.asynccontextmanager
async def serving(js_env, policy: Path, options: ServiceOptions = FAST) -> AsyncIterator[Running]:  # type: ignore[no-untyped-def]
    """The service as ``serve`` builds it: machines and config from files, reloadable."""
    nc = await connect(js_env.server)
    events = Events()
    reloader = PolicyReloader.open(policy / "machines", policy / "config" / "queues.yaml")
    service = Service(
        nc,
        js_env.topology,
        reloader.machines,
        reloader.config,
        source_control=memory_provider()[1],
        options=options,
        observer=events,
        reloader=reloader,
    )
    try:
        await asyncio.wait_for(service.start(), WAIT_S)
        yield Running(service, events, nc)
    finally:
        try:
            await asyncio.wait_for(service.stop(), WAIT_S)
        finally:
            await asyncio.wait_for(nc.close(), WAIT_S)


async def shown_hash(js_env) -> str:  # type: ignore[no-untyped-def]
    doc = await status_document(js_env.js, js_env.topology)
    return str(doc["policy"]["hash"])


async def test_an_edited_machine_is_taken_up_with_a_new_hash(js_env, tmp_path) -> None:
    policy = policy_copy(tmp_path / "policy")
    options = ServiceOptions(**{**FAST.__dict__, "policy_check_interval_s": 0.1})
    async with serving(js_env, policy, options) as run:
        before = run.service.policy_hash
        assert await shown_hash(js_env) == before
        metrics = await render_metrics(run.service)
        assert f'stovepipe_policy_info{{hash="{before}"}} 1' in metrics
        a = await run.ingest(QUEUE, "A")
        await run.wait_state(a, "processing")
        b = await run.ingest(QUEUE, "B")
        await wait_for(lambda: _held(run, b), "B held behind A (one slot)")

        edit(policy / "machines" / GATE_YAML.name, ONE_SLOT, TWO_SLOTS)

        async def new_hash_shown() -> str | None:
            shown = await shown_hash(js_env)
            return shown if shown != before else None

        after = await wait_for(new_hash_shown, "the new policy hash in status")
        assert after == run.service.policy_hash
        assert f'stovepipe_policy_info{{hash="{after}"}} 1' in await render_metrics(run.service)
        assert run.service.reloader is not None and run.service.reloader.last_error is None
        # B's next recheck runs on the new stages: a second slot, so B is admitted.
        await run.wait_state(b, "processing")
        assert (await run.queue(QUEUE)).in_flight_count == 2


async def _held(run: Running, request_id: str) -> bool:
    return run.events.count("held", request_id) >= 1


async def test_a_config_edit_changes_the_hash_too(js_env, tmp_path) -> None:
    policy = policy_copy(tmp_path / "policy")
    async with serving(js_env, policy) as run:
        before = run.service.policy_hash
        (policy / "config" / "queues.yaml").write_text(CONFIG + "queues: {team/app: {}}\n")
        assert await run.service.crew.policy.reload()
        assert run.service.policy_hash not in ("", before)
        assert await shown_hash(js_env) == run.service.policy_hash
        assert not await run.service.crew.policy.reload()  # nothing new: nothing reloaded


async def test_a_broken_edit_keeps_the_policy_and_logs_where(
    js_env, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    policy = policy_copy(tmp_path / "policy")
    gate = policy / "machines" / GATE_YAML.name
    async with serving(js_env, policy) as run:
        before = run.service.policy_hash
        in_force = run.service.crew.pipeline.stages
        edit(gate, "initial: received\n", "initial: recieved\n")
        with caplog.at_level(logging.WARNING, logger="stovepipe_fsm.service"):
            assert not await run.service.crew.policy.reload()
        warning = "\n".join(r.getMessage() for r in caplog.records)
        line = gate.read_text().splitlines().index("initial: recieved") + 1
        assert "new version not loaded, keeping the policy in force" in warning
        assert f"{gate}:{line}:10:" in warning and "recieved" in warning
        assert run.service.policy_hash == before and await shown_hash(js_env) == before
        assert run.service.crew.pipeline.stages is in_force
        # status and /readyz say so: which part, where, since when; still ready.
        refused = (await status_document(js_env.js, js_env.topology))["policy"]["refused"]
        assert (refused["part"], refused["now"]) == ("machines", True)
        assert f"{gate}:{line}:10:" in refused["error"]
        [note] = run.service.readiness_notes()
        assert note.startswith("policy edit refused (machines) at ") and "recieved" in note
        assert run.service.ready
        # The old policy still runs: one slot, so B is held behind A.
        a = await run.ingest(QUEUE, "A")
        await run.wait_state(a, "processing")
        b = await run.ingest(QUEUE, "B")
        await wait_for(lambda: _held(run, b), "B held under the policy in force")
        # Fixed, with the new default: taken up, error cleared.
        edit(gate, "initial: recieved\n", "initial: received\n")
        edit(gate, ONE_SLOT, TWO_SLOTS)
        assert await run.service.crew.policy.reload()
        assert run.service.reloader is not None and run.service.reloader.last_error is None
        await run.wait_state(b, "processing")
        shown = (await status_document(js_env.js, js_env.topology))["policy"]
        assert shown["refused"]["now"] is False  # kept, as replaced since
        assert shown["machines_loaded_at_ms"] >= refused["at_ms"]
        assert run.service.readiness_notes() == []


async def test_removing_a_request_state_is_refused_with_the_reason(
    js_env, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    policy = policy_copy(tmp_path / "policy")
    request = policy / "machines" / REQUEST_YAML.name
    async with serving(js_env, policy) as run:
        before = run.service.policy_hash
        machines = run.service.machines
        for cut in CANCELLED:
            edit(request, cut, "")
        with caplog.at_level(logging.WARNING, logger="stovepipe_fsm.service"):
            assert not await run.service.crew.policy.reload()
        warning = "\n".join(r.getMessage() for r in caplog.records)
        assert "removes state(s) 'cancelled' of the machine in force" in warning
        assert "stored requests may be in them" in warning
        assert run.service.machines is machines and run.service.policy_hash == before
        reloader = run.service.reloader
        assert reloader is not None and reloader.last_error is not None
        assert "'cancelled'" in reloader.last_error
        record = await read_policy_record(js_env.js, js_env.topology)
        assert record is not None and record.hash == before


async def test_new_machines_the_config_does_not_fit_are_refused(js_env, tmp_path) -> None:
    # The config sets a parameter the machines in force declare; a version without the
    # declaration loads, but would make the config in force invalid: refused with the
    # config's located issue.
    policy = policy_copy(tmp_path / "policy")
    gate = policy / "machines" / GATE_YAML.name
    declared = (
        "parameters:\n  build_window:\n    type: string\n    default: always\n"
        "    description: when builds may start\n"
    )
    edit(gate, "parameters:\n", declared)
    config = policy / "config" / "queues.yaml"
    config.write_text("defaults: {gate_wait_delay_ms: 100, build_window: nights}\n")
    async with serving(js_env, policy) as run:
        before = run.service.policy_hash
        machines = run.service.machines
        edit(gate, declared, "parameters:\n")
        assert not await run.service.crew.policy.reload()
        reloader = run.service.reloader
        assert reloader is not None and reloader.last_error is not None
        assert f"{config}:1:" in reloader.last_error and "build_window" in reloader.last_error
        assert run.service.machines is machines and run.service.policy_hash == before
        assert run.service.config.get(QUEUE).param("build_window") == "nights"
        # The config edited to fit the new machines: the refused version is taken up.
        config.write_text("defaults: {gate_wait_delay_ms: 100}\n")
        assert await run.service.crew.policy.reload()
        assert reloader.last_error is None and run.service.machines is not machines
        assert "build_window" not in run.service.machines.parameters


ALIAS_BOMB = "\n".join(
    [
        'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
        *(
            f"{n}: &{n} [{','.join([f'*{p}'] * 9)}]"
            for p, n in zip("abcdefgh", "bcdefghi", strict=True)
        ),
    ]
)


async def test_an_alias_bomb_hot_reloaded_into_the_config_is_refused_fast_and_located(
    js_env, tmp_path, monkeypatch
) -> None:
    """A few hundred bytes that expand to a billion values: refused with the entry's
    file:line:col once the bound on values is passed, parsed off the event loop, policy
    unchanged."""
    policy = policy_copy(tmp_path / "policy")
    config = policy / "config" / "queues.yaml"
    async with serving(js_env, policy) as run:
        before = run.service.policy_hash
        config.write_text(ALIAS_BOMB)
        assert len(ALIAS_BOMB.encode()) < 400
        gaps: list[float] = []
        ticking = True

        async def ticker() -> None:
            last = time.perf_counter()
            while ticking:
                await asyncio.sleep(0.01)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        task = asyncio.ensure_future(ticker())
        built = counted_values(monkeypatch)
        try:
            assert not await run.service.crew.policy.reload()
        finally:
            ticking = False
            await task
        # Off the loop: the ticker kept running while the file was parsed (how many ticks
        # depends on the machine's load, so only that it ticked is asserted).
        assert len(gaps) >= 1
        # Bounded: the reload stopped one value past the bound, not after the billion.
        assert 0 < len(built) <= MAX_VALUES + 1
        error = run.service.config.last_error
        assert error is not None
        assert f"{config}:6:1: the document expands to more than" in str(error)
        assert run.service.policy_hash == before
        # The queue runs on the policy in force.
        a = await run.ingest(QUEUE, "A")
        await run.wait_state(a, "processing")


async def test_a_plugin_that_exits_on_import_is_refused_and_the_service_keeps_serving(
    js_env, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    # A new version lists a plugin whose import raises SystemExit: a located
    # plugin-import error; the process, the policy in force and its hash stay.
    policy = policy_copy(tmp_path / "policy")
    gate = policy / "machines" / GATE_YAML.name
    (policy / "exiting_rules.py").write_text("import sys\n\nsys.exit(3)\n")
    async with serving(js_env, policy) as run:
        before = run.service.policy_hash
        machines = run.service.machines
        edit(gate, "initial: received\n", "initial: received\nplugins: [exiting_rules]\n")
        with caplog.at_level(logging.WARNING, logger="stovepipe_fsm.service"):
            assert not await run.service.crew.policy.reload()
        line = gate.read_text().splitlines().index("plugins: [exiting_rules]") + 1
        expected = f"{gate}:{line}:11: plugin 'exiting_rules' cannot be imported: SystemExit: 3"
        warning = "\n".join(r.getMessage() for r in caplog.records)
        assert "new version not loaded, keeping the policy in force" in warning
        assert expected in warning
        reloader = run.service.reloader
        assert reloader is not None and reloader.last_error == expected
        assert run.service.machines is machines and run.service.policy_hash == before
        assert await shown_hash(js_env) == before
        a = await run.ingest(QUEUE, "A")  # the policy in force still serves
        await run.wait_state(a, "processing")
        # The plugin fixed (and the machine touched): the new version is taken up.
        (policy / "exiting_rules.py").write_text("def register(plugin):\n    pass\n")
        edit(gate, ONE_SLOT, TWO_SLOTS)
        assert await run.service.crew.policy.reload()
        assert reloader.last_error is None and run.service.machines is not machines


async def test_culprit_yaml_added_under_the_running_service_starts_searches(
    js_env, tmp_path
) -> None:
    """Adding ``culprit.yaml`` (and a red outcome) builds the search into the stages in
    force; the config's ``probe_slots``, a parameter only that machine declares, follows."""
    policy = policy_copy(tmp_path / "policy")
    async with serving(js_env, policy) as run:
        a = await run.ingest(QUEUE, "A")
        await run.wait_state(a, "processing")
        await run.pipeline.record_outcome(a, "succeeded")
        machines = policy / "machines"
        edit(
            machines / REQUEST_YAML.name,
            "failed: {trigger: fail}",
            "failed: {trigger: fail, red: true}",
        )
        shutil.copyfile(Path("machines") / "culprit.yaml", machines / "culprit.yaml")
        assert await run.service.crew.policy.reload()
        (policy / "config" / "queues.yaml").write_text(
            CONFIG + "queues: {team/app: {probe_slots: 1}}\n"
        )
        assert await run.service.crew.policy.reload()
        d = (await run.pipeline.stages.ingest.ingest(QUEUE, "D")).request_id
        await run.wait_state(d, "processing")
        await run.pipeline.record_outcome(d, "failed")
        search = await run.pipeline.ports.searches.get(QUEUE)
        assert (search.state, search.red_request_id, search.blamelist) == (
            "searching",
            d,
            ("B", "C", "D"),
        )
        (probe,) = search.probes
        assert (await run.request(probe.request_id)).probe_of == d
