"""``pause``/``resume`` on a real nats-server: held within a hold delay, kept in the
broker across a restart, idempotent, refused for a policy that cannot pause."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
from pathlib import Path

import pytest
from nats_server import (
    configured_server,
    subscribe_denied_config,
    subscribe_denied_server,
    unique_tag,
)
from test_service_cli import ROOT, cli, tag  # noqa: F401
from test_service_support import FAST, running_service, wait_for

from stovepipe_fsm.adapters.jetstream import Topology
from stovepipe_fsm.adapters.jetstream.policy_record import PolicyRecord, write_policy_record
from stovepipe_fsm.apps.service.connect import NatsOptions
from stovepipe_fsm.apps.service.http import render_metrics
from stovepipe_fsm.apps.service.operators import explain_document, status_document
from stovepipe_fsm.apps.service.pauses import pause, read_pauses, resume

QUEUE = "team/app"
CONFIG = {"defaults": {"gate_wait_delay_ms": 100}}


async def test_a_paused_glob_holds_its_queues_until_resumed_across_a_restart(js_env) -> None:
    js, topology = js_env.js, js_env.topology
    async with running_service(js_env.server, topology, CONFIG) as run:
        done, new = await pause(js, topology, "team/*", reason="incident 42", by="oncall")
        assert new and done.pattern == "team/*"
        again, new_again = await pause(js, topology, "team/*")
        assert not new_again and again == done  # idempotent: the first pause stands
        async def taken_up() -> bool:
            await run.service.crew.policy.refresh_pauses()
            return run.service.config.paused(QUEUE)

        await wait_for(taken_up, "the service took the pause up", timeout=5)
        a = await run.ingest(QUEUE, "A")

        async def held_paused() -> bool:
            history = (await explain_document(options(js_env), topology, a, "", ""))["history"]
            return any(r["kind"] == "held" and r["detail"]["reason"] == "paused" for r in history)

        await wait_for(held_paused, "A held as paused")
        assert await run.state(a) == "accepted"
        doc = await status_document(js, topology)
        assert [p["pattern"] for p in doc["pauses"]] == ["team/*"]
        assert doc["queue_details"][QUEUE]["parameters"]["paused"] is True
    # A restart keeps the pause: the head stays held.
    async with running_service(js_env.server, topology, CONFIG) as run:
        assert [p.pattern for p in run.service.config.pauses] == ["team/*"]
        b = await run.ingest("team/other", "B")
        await wait_for(lambda: _held(run, b), "B held")
        assert await run.state(b) == "accepted"
        assert await resume(js, topology, "team/*")
        assert not await resume(js, topology, "team/*")  # idempotent
        await run.wait_state(a, "processing")
        await run.wait_state(b, "processing")
    assert await read_pauses(js, topology) == []


async def _held(run, request_id: str) -> bool:  # type: ignore[no-untyped-def]
    return bool(run.events.count("held", request_id))


def options(js_env) -> NatsOptions:  # type: ignore[no-untyped-def]
    return NatsOptions(url=js_env.server.url, max_reconnect_attempts=3)


async def test_pause_is_refused_when_the_policy_in_force_cannot_pause(js_env) -> None:
    tag_ = js_env.topology.prefix.removeprefix("stovepipe-")
    record = PolicyRecord("cafe", 0, "r", parameters=["max_concurrent"])
    await write_policy_record(js_env.js, js_env.topology, record)
    done = cli("pause", QUEUE, "--nats", js_env.server.url, "--topology-tag", tag_)
    assert done.returncode == 2, done.stderr
    assert "declares no 'paused' parameter" in done.stderr
    bad = cli("resume", "bad queue\n", "--nats", js_env.server.url, "--topology-tag", tag_)
    assert bad.returncode == 2, bad.stderr
    ok = cli("resume", QUEUE, "--nats", js_env.server.url, "--topology-tag", tag_)
    assert ok.returncode == 0 and json.loads(ok.stdout) == {"resumed": QUEUE, "was_paused": False}


async def test_a_pause_and_a_resume_are_taken_up_as_they_are_written(js_env) -> None:
    """The service learns of a pause key's write from the bucket's subject, not only at
    its periodic read (set here to a minute, so only the announcement can explain it)."""
    js, topology = js_env.js, js_env.topology
    slow_reads = dataclasses.replace(FAST, policy_check_interval_s=60.0)
    async with running_service(js_env.server, topology, CONFIG, options=slow_reads) as run:
        assert run.service.crew.wakeups.refused == {}
        await pause(js, topology, "team/*", reason="incident 43")

        async def paused() -> bool:
            return run.service.config.paused(QUEUE)

        # Well before the periodic read a minute away: only the write's announcement.
        await wait_for(paused, "the pause taken up from its write", timeout=5)
        a = await run.ingest(QUEUE, "A")
        await wait_for(lambda: _held(run, a), "A held while paused")
        assert await run.state(a) == "accepted"

        assert await resume(js, topology, "team/*")

        async def resumed() -> bool:
            return not run.service.config.paused(QUEUE)

        await wait_for(resumed, "the resume taken up from its write", timeout=5)
        await run.wait_state(a, "processing")


@pytest.mark.nats  # a broker of its own, with restricted subjects
async def test_a_user_not_allowed_the_pause_subjects_still_gets_every_pause(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker refuses the pause-write subscription to a user without the right. The
    service says so (a warning naming the subject and the remedy, ``/metrics``), drops
    it, and takes pauses up at its once-a-second read."""
    caplog.set_level(logging.WARNING, logger="stovepipe_fsm.service")
    with subscribe_denied_server(tmp_path, ["$KV.*.pause.>"]) as server:
        topology = Topology.isolated(unique_tag())
        async with running_service(server, topology, CONFIG) as run:
            service = run.service
            assert list(service.crew.wakeups.refused) == ["pause"]
            assert "permissions violation" in service.crew.wakeups.refused["pause"]
            warned = [r.getMessage() for r in caplog.records if "not allowed" in r.getMessage()]
            assert len(warned) == 1
            assert f"$KV.{topology.service_bucket}.pause.>" in warned[0]
            assert "taken up at the once-a-second read" in warned[0]
            metrics = await render_metrics(service)
            assert 'stovepipe_subscription_refused{subscription="pause"} 1' in metrics
            assert 'stovepipe_subscription_refused{subscription="publish"} 0' in metrics

            js = run.nc.jetstream()
            await pause(js, topology, "team/*", reason="incident 44")

            async def paused() -> bool:
                return service.config.paused(QUEUE)

            await wait_for(paused, "the pause taken up at the periodic read", timeout=5)
            a = await run.ingest(QUEUE, "A")
            await wait_for(lambda: _held(run, a), "A held while paused")
            assert await resume(js, topology, "team/*")
            await run.wait_state(a, "processing")


@pytest.mark.nats  # a broker of its own, with restricted subjects
async def test_a_subscription_a_broker_reload_takes_away_is_reported_and_taken_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A broker config reload takes the pause-write right away: the broker removes the
    subscription and says so on the connection only. The service reports it as at start,
    once, however many retries are refused; given the right back by another reload, it
    subscribes again at the next retry, and a pause wakes it at once again.

    The once-a-second pause read is made a minute here, so that only the subscription
    can take the last pause up within the wait."""
    caplog.set_level(logging.INFO, logger="stovepipe_fsm.service")
    allowed = subscribe_denied_config(tmp_path, ["nothing.at.all"])
    pauses = "$KV.*.pause.>"
    options = dataclasses.replace(FAST, refused_retry_s=0.2, policy_check_interval_s=60.0)
    with configured_server(tmp_path, allowed) as server:
        assert server.pid is not None
        topology = Topology.isolated(unique_tag())
        async with running_service(server, topology, CONFIG, options=options) as run:
            service = run.service
            assert service.crew.wakeups.refused == {}

            subscribe_denied_config(tmp_path, [pauses])
            os.kill(server.pid, signal.SIGHUP)  # nats-server reloads its config

            async def refused() -> bool:
                return "pause" in service.crew.wakeups.refused

            await wait_for(refused, "the removed subscription reported", timeout=10)
            assert list(service.crew.wakeups.refused) == ["pause"]
            metrics = await render_metrics(service)
            assert 'stovepipe_subscription_refused{subscription="pause"} 1' in metrics
            await asyncio.sleep(1.0)  # five retries or so, each refused again
            assert list(service.crew.wakeups.refused) == ["pause"]
            said = [r.getMessage() for r in caplog.records if "pause.>" in r.getMessage()]
            assert len(said) == 1, said  # neither the retries nor the client repeat it
            assert said[0].startswith("not allowed to subscribe to")

            allowed = subscribe_denied_config(tmp_path, ["nothing.at.all"])
            os.kill(server.pid, signal.SIGHUP)

            async def allowed_again() -> bool:
                return service.crew.wakeups.refused == {}

            await wait_for(allowed_again, "the subscription made again", timeout=10)
            metrics = await render_metrics(service)
            assert 'stovepipe_subscription_refused{subscription="pause"} 0' in metrics
            assert any("now allowed to subscribe" in r.getMessage() for r in caplog.records)

            await pause(run.nc.jetstream(), topology, "team/*", reason="incident 45")

            async def paused() -> bool:
                return service.config.paused(QUEUE)

            await wait_for(paused, "the pause taken up from its write", timeout=5)
