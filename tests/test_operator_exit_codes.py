"""The exit codes docs/service.md documents for the operator commands, checked for each:
0 done, 2 bad input or an illegal operation (with a sentence saying why), 1 broker
unreachable or refused."""

from __future__ import annotations

import asyncio

import pytest
from test_service_cli import tag  # noqa: F401

from stovepipe_fsm.adapters.jetstream import NatsServer
from stovepipe_fsm.adapters.jetstream.server import free_port
from stovepipe_fsm.apps.cli import main
from stovepipe_fsm.apps.options import EXIT_FAIL, EXIT_OK, EXIT_USAGE

R = "request/monorepo/main/1"
BY_ID = ("--queue", "monorepo/main", "--request-id")
VERBS = {
    "ingest": ["ingest", "--queue", "monorepo/main", "--uri", "A"],
    "complete": ["complete", "--queue", "monorepo/main", "--uri", "A", "--outcome", "failed"],
    "pause": ["pause", "monorepo/*"],
    "resume": ["resume", "monorepo/*"],
    "cancel": ["cancel", R],
    "retry": ["retry", R],
    "dlq list": ["dlq", "list"],
    "dlq replay": ["dlq", "replay", "--all"],
    "dlq prune": ["dlq", "prune", "--older-than", "7d"],
}


@pytest.mark.parametrize("argv", list(VERBS.values()), ids=list(VERBS))
def test_an_unreachable_broker_is_exit_1(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    assert main([*argv, "--nats", url, "--connect-timeout", "1"]) == EXIT_FAIL
    err = capsys.readouterr().err
    assert f"error: cannot reach NATS: no connection to {url}" in err


def _on(server: NatsServer, tag_: str, *argv: str) -> list[str]:
    return [*argv, "--nats", server.url, "--topology-tag", tag_]


def test_bad_input_and_illegal_operations_are_exit_2_with_a_sentence(
    nats_server: NatsServer, tag: str, capsys: pytest.CaptureFixture[str]  # noqa: F811
) -> None:
    def run(*argv: str) -> tuple[int, str]:
        code = main(_on(nats_server, tag, *argv))
        return code, capsys.readouterr().err

    # Before any service ran: the verbs that need the policy in force say so.
    assert run("cancel", R) == (
        EXIT_USAGE,
        "error: no service has recorded the policy in force on this broker yet; cancel, "
        "retry and dlq replay take the request machine from it (run serve once)\n",
    )
    code, _ = run("ingest", "--queue", "monorepo/main", "--uri", "A")
    assert code == EXIT_OK
    asyncio.run(_record_shipped_policy(nats_server, tag))
    cases = [
        (("cancel",), "error: give a REQUEST_ID, or --queue and --uri"),
        (("cancel", R, "--queue", "q", "--uri", "u"), "give a REQUEST_ID, or --queue and --uri"),
        (("cancel", "request/monorepo/main/9"), "no request 'request/monorepo/main/9'"),
        (("cancel", "--queue", "monorepo/main", "--uri", "Z"), "no request for 'Z'"),
        (("retry", R), f"request {R} is accepted, it has not ended"),
        (("dlq", "replay"), "give a record ID, or --all"),
        (("dlq", "replay", "7", "--all"), "give a record ID, or --all"),
        (("dlq", "replay", "7"), "no dead letter 7"),
        (("ingest", "--queue", "bad queue\n", "--uri", "A"), "queue name"),
        (("complete", "--queue", "monorepo/main", "--uri", "Z", "--outcome", "failed"), "Z"),
        (
            ("complete", *BY_ID, "request/monorepo/main/9", "--outcome", "failed"),
            "'request/monorepo/main/9'",
        ),
        (
            ("complete", *BY_ID, "request/other/1", "--outcome", "failed"),
            "request 'request/other/1' is not of queue 'monorepo/main'",
        ),
        (("pause", ""), "give a queue name or a glob"),
        (("resume", "bad queue\n"), "queue name"),
    ]
    for argv, said in cases:
        code, err = run(*argv)
        assert (code, said in err) == (EXIT_USAGE, True), (argv, err)
        assert err.startswith("error: ") and "Traceback" not in err, (argv, err)
    assert run("cancel", R)[0] == EXIT_OK
    assert run("cancel", R)[0] == EXIT_OK  # idempotent


async def _record_shipped_policy(server: NatsServer, tag_: str) -> None:
    """What ``serve`` writes on start, for the shipped policy."""
    from nats_server import connect

    from stovepipe_fsm.adapters.jetstream import Topology
    from stovepipe_fsm.adapters.jetstream.policy_record import write_policy_record
    from stovepipe_fsm.apps.service.policy import policy_record
    from stovepipe_fsm.process.catalog import load_process_machines

    record = policy_record(load_process_machines("machines"), "shipped", "test", 0)
    nc = await connect(server)
    try:
        await write_policy_record(nc.jetstream(), Topology.isolated(tag_), record)
    finally:
        await nc.close()
