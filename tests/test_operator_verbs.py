"""``cancel`` and ``retry`` on the real stages with in-memory ports: the moves, their
races with the process stage, and what the gate does with a cancelled head afterwards."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from stovepipe_fsm.adapters.memory.config import StaticConfigStore
from stovepipe_fsm.config.loader import load_queue_config
from stovepipe_fsm.domain.entities import Queue, Request
from stovepipe_fsm.domain.errors import IllegalOperation, NotFound
from stovepipe_fsm.domain.trail_record import OPERATOR
from stovepipe_fsm.located.yaml_source import parse_yaml
from stovepipe_fsm.machine.compiler import CompiledLifecycle
from stovepipe_fsm.machine.loader import parse_machine
from stovepipe_fsm.pipeline.verbs import cancel, queue_coalesces, retry
from stovepipe_fsm.ports.stores import RequestStore
from stovepipe_fsm.process.catalog import REGISTRIES, compile_request_machine, load_process_machines
from stovepipe_fsm.process.lifecycle import QueueChange, RequestLifecycle
from stovepipe_fsm.process.roles import RequestRoles
from stovepipe_fsm.simulation.broker import run_sync
from stovepipe_fsm.simulation.world import World

ROOT = Path(__file__).resolve().parent.parent
Q = "monorepo/main"
A1, A2, A3 = (f"request/{Q}/{n}" for n in (1, 2, 3))
MACHINES = load_process_machines(ROOT / "machines")


def world(max_concurrent: int = 1) -> World:
    config = StaticConfigStore(
        {"defaults": {"max_concurrent": max_concurrent, "gate_wait_delay_ms": 1000}}
    )
    history = {"A1": [], "A2": ["A1"], "A3": ["A2"]}
    return World(MACHINES, config, history)


def lifecycle(
    w: World,
    machine: CompiledLifecycle = MACHINES.request,
    requests: RequestStore | None = None,
    cls: type[RequestLifecycle] = RequestLifecycle,
) -> RequestLifecycle:
    """A lifecycle on ``w``'s stores over ``machine``, as an operator command builds one
    over the machine the service recorded."""
    roles = RequestRoles.from_spec(machine.spec)
    store = requests if requests is not None else w.requests
    return cls(machine, roles, store, w.queues, clock=w.clock)


def do_cancel(w: World, request_id: str, machine: CompiledLifecycle = MACHINES.request):  # type: ignore[no-untyped-def]
    verb = cancel(lifecycle(w, machine), w.trail, w.clock, request_id, by="op", policy_hash="test")
    return run_sync(verb)


def do_retry(w: World, request_id: str):  # type: ignore[no-untyped-def]
    return run_sync(retry(lifecycle(w), w.stages.ingest, w.uri_index, request_id, by="op"))


def request_machine(edits: tuple[tuple[str, str], ...], *conditions: str) -> CompiledLifecycle:
    """The shipped request machine with ``edits`` made to its YAML, compiled against the
    built-in registry plus each of ``conditions`` registered as always false."""
    text = MACHINES.request.spec.source
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    registry = REGISTRIES["request"].copy()
    for name in conditions:
        registry.condition(name)(lambda request: False)
    return CompiledLifecycle(parse_machine(parse_yaml(text, "request.yaml")), registry)


def state(w: World, request_id: str) -> str:
    return run_sync(w.requests.get(request_id)).state


def holders(w: World) -> tuple[str, ...]:
    return run_sync(w.queues.get(Q)).slot_holders


def operator_records(w: World, request_id: str) -> list[dict[str, str]]:
    assert w.trail is not None
    history = run_sync(w.trail.history(request_id))
    return [dict(r.detail) for r in history if r.kind == OPERATOR]


def test_the_shipped_policy_names_its_withdraw_role() -> None:
    roles = load_process_machines(ROOT / "machines").roles
    assert roles.withdraw == "withdraw"
    assert roles.withdrawn_states == frozenset({"cancelled"})


def test_cancel_ends_a_waiting_head_once_and_the_gate_acks_it() -> None:
    w = world()
    w.ingest(Q, "A1")
    first = do_cancel(w, A1)
    assert first.cancelled and first.request.state == "cancelled"
    assert first.request.ended_at_ms == w.clock.now_ms()
    again = do_cancel(w, A1)  # idempotent: already ended as the cancel ends it
    assert not again.cancelled and again.request.version == first.request.version
    assert operator_records(w, A1) == [
        {"verb": "cancel", "by": "op", "what": "withdrawn while waiting (accepted -> cancelled)"}
    ]
    report = w.deliver_next()  # the process message: a terminal head is simply acked
    assert report is not None and report.outcome == "acked"
    assert holders(w) == () and w.published.builds() == ()


def test_cancel_refuses_a_running_head_and_an_otherwise_ended_one() -> None:
    w = world()
    w.ingest(Q, "A1")
    assert w.deliver_next().outcome == "acked"  # type: ignore[union-attr]
    with pytest.raises(IllegalOperation, match=r"is running \(processing, admitted .*never "):
        do_cancel(w, A1)
    w.complete(A1, "succeeded")
    with pytest.raises(IllegalOperation, match="already ended as succeeded; there is nothing"):
        do_cancel(w, A1)
    assert state(w, A1) == "succeeded"


def test_cancel_of_a_build_that_ended_cancelled_is_a_repeat_and_records_nothing() -> None:
    w = world()
    w.ingest(Q, "A1")
    w.deliver_next()
    w.complete(A1, "cancelled")  # the build system stopped it
    assert not do_cancel(w, A1).cancelled
    assert operator_records(w, A1) == []


def test_cancel_needs_a_withdraw_role_in_the_policy_in_force() -> None:
    w = world()
    w.ingest(Q, "A1")
    without = request_machine(((WITHDRAW_ROLE, ""),))
    with pytest.raises(IllegalOperation, match=r"\(test\) declares no withdraw transition"):
        do_cancel(w, A1, without)
    assert state(w, A1) == "accepted"


def test_cancel_is_the_machines_withdraw_a_withdraw_it_refuses_writes_nothing() -> None:
    # The policy guards its withdrawal with a condition that does not hold: the machine
    # refuses the trigger, so the waiting head stays as it is, slot claim and all.
    guarded = WITHDRAW_TRANSITION + "    conditions: [withdrawal_approved]\n"
    machine = request_machine(((WITHDRAW_TRANSITION, guarded),), "withdrawal_approved")
    w = world()
    w.ingest(Q, "A1")
    assert w.stall("after_claim_slot") is not None
    before = run_sync(w.requests.get(A1))
    with pytest.raises(IllegalOperation, match="cannot be withdrawn: the policy in force"):
        do_cancel(w, A1, machine)
    assert run_sync(w.requests.get(A1)) == before and holders(w) == (A1,)
    assert operator_records(w, A1) == []


def test_the_slot_of_a_cancelled_head_is_freed_by_the_lifecycle() -> None:
    class Recording(RequestLifecycle):
        """The lifecycle, noting the triggers it applies and the ends it settles; it
        settles nothing, so a slot freed anyway was freed by someone else."""

        applied: list[str] = []
        settled: list[str] = []

        async def apply(self, request: Request, trigger: str, **kwargs: object) -> Request:
            self.applied.append(trigger)
            return await super().apply(request, trigger, **kwargs)  # type: ignore[arg-type]

        async def settle_queue(
            self, request: Request, queue_change: QueueChange | None = None
        ) -> Queue:
            self.settled.append(f"{request.id} {request.state}")
            return await self.queues.get(request.queue)

    w = world()
    w.ingest(Q, "A1")
    assert w.stall("after_claim_slot") is not None
    mine = lifecycle(w, cls=Recording)
    assert run_sync(cancel(mine, w.trail, w.clock, A1)).cancelled
    assert Recording.applied == ["withdraw"] and Recording.settled == [f"{A1} cancelled"]
    assert holders(w) == (A1,)  # the verb itself gives nothing back


def test_the_recorded_request_machine_compiles_to_the_one_in_force() -> None:
    recorded = compile_request_machine(MACHINES.request.spec.source)
    shipped = MACHINES.request
    assert recorded.spec.source == shipped.spec.source != ""

    def table(machine: CompiledLifecycle) -> list[tuple[str, str, str]]:
        spec = machine.spec
        return [(t.trigger, s, t.dest.name) for t in spec.transitions for s in t.source_names]

    assert table(recorded) == table(shipped) and recorded.terminal == shipped.terminal
    assert RequestRoles.from_spec(recorded.spec) == MACHINES.roles
    assert MACHINES.roles.retryable_states == frozenset({"failed", "cancelled"})


def test_cancel_that_wins_the_race_with_an_admission_frees_the_claim() -> None:
    # The gate claimed a slot for A1 and stalled before its admit write; the cancel wins.
    w = world()
    w.ingest(Q, "A1")
    assert w.stall("after_claim_slot") is not None
    assert holders(w) == (A1,)
    assert do_cancel(w, A1).cancelled
    assert holders(w) == ()  # the claim of the admission that is about to lose
    report = w.resume(A1)
    assert report.outcome == "retry" and "changed while admitting" in report.detail
    assert state(w, A1) == "cancelled" and holders(w) == ()
    assert w.published.builds() == ()


def test_cancel_that_loses_the_race_with_an_admission_refuses_and_writes_nothing() -> None:
    w = world()
    w.ingest(Q, "A1")
    loaded = run_sync(w.requests.get(A1))

    class AdmitFirst:
        """The request store, with the gate's admission landing between cancel's read
        and its compare-and-set."""

        def __init__(self) -> None:
            self.raced = False

        async def get(self, request_id: str) -> Request:
            return await w.requests.get(request_id)

        async def update(self, request: Request, old: int, new: int) -> None:
            if not self.raced:
                self.raced = True
                admitted = replace(loaded, state="processing", admitted_at_ms=1)
                await w.requests.update(admitted, loaded.version, loaded.version + 1)
            await w.requests.update(request, old, new)

        async def create(self, request: Request) -> None:
            await w.requests.create(request)

    store = AdmitFirst()
    with pytest.raises(IllegalOperation, match="is running"):
        run_sync(cancel(lifecycle(w, requests=store), w.trail, w.clock, A1))
    assert store.raced and state(w, A1) == "processing"
    assert operator_records(w, A1) == []


def test_a_cancelled_latest_head_still_supersedes_the_older_waiting_ones() -> None:
    w = world()
    for uri in ("A1", "A2", "A3"):
        w.ingest(Q, uri)
    assert do_cancel(w, A3).cancelled
    reports = [w.deliver_next() for _ in range(3)]
    assert [r.outcome for r in reports if r is not None] == ["acked", "acked", "acked"]
    assert [state(w, r) for r in (A1, A2, A3)] == ["superseded", "superseded", "cancelled"]
    assert run_sync(w.requests.get(A1)).superseded_by == A3
    assert holders(w) == () and w.published.builds() == ()
    # Nothing waits: the next head is admitted as usual.
    w.ingest(Q, "A4")
    assert w.deliver_next().outcome == "acked"  # type: ignore[union-attr]
    assert state(w, f"request/{Q}/4") == "processing"


def test_retry_makes_one_new_request_for_the_commit_linked_to_the_old_one() -> None:
    w = world()
    w.ingest(Q, "A1")
    w.deliver_next()
    w.complete(A1, "failed")
    first = do_retry(w, A1)
    assert first.created and first.request_id == A2
    new = run_sync(w.requests.get(A2))
    assert (new.uri, new.state, new.retry_of) == ("A1", "accepted", A1)
    assert w.request_for(Q, "A1") == A2
    second = do_retry(w, A1)  # idempotent: the link finds the first retry
    assert not second.created and second.request_id == A2
    assert run_sync(w.queues.get(Q)).latest_request_id == A2
    assert operator_records(w, A1) == [
        {"verb": "retry", "by": "op", "what": f"retried as {A2}", "retry": A2}
    ]
    assert w.deliver_next().outcome == "acked"  # type: ignore[union-attr]
    assert state(w, A2) == "processing"


def test_retry_of_a_cancelled_latest_head_validates_it_again() -> None:
    w = world()
    w.ingest(Q, "A1")
    do_cancel(w, A1)
    assert do_retry(w, A1).request_id == A2
    w.deliver_next()
    w.deliver_next()
    assert state(w, A2) == "processing"


def test_retry_refuses_an_open_head_a_green_one_and_an_older_commit() -> None:
    w = world()
    w.ingest(Q, "A1")
    with pytest.raises(IllegalOperation, match="is accepted, it has not ended"):
        do_retry(w, A1)
    w.deliver_next()
    w.complete(A1, "failed")
    w.ingest(Q, "A2")
    with pytest.raises(IllegalOperation, match=f"a newer head {A2} was ingested since"):
        do_retry(w, A1)
    w.deliver_next()
    w.complete(A2, "succeeded")
    with pytest.raises(IllegalOperation, match="ended succeeded; only a head that ended"):
        do_retry(w, A2)
    assert run_sync(w.queues.get(Q)).latest_request_id == A2


# --- the withdraw role, as lint checks it ---------------------------------------------

WITHDRAW_ROLE = (
    "  withdraw: withdraw         # an operator's cancel ends a waiting head (optional role)\n"
)
WITHDRAW_TRANSITION = "  - trigger: withdraw\n    source: accepted\n    dest: cancelled\n"


def _messages(text: str) -> list[str]:
    from test_machine_lint import lint_text

    return [f"{i.rule}: {i.message}" for i in lint_text(text)]


def test_the_withdraw_role_is_optional() -> None:
    from test_machine_lint import REQUEST, edit

    assert _messages(REQUEST) == []
    assert _messages(edit(REQUEST, WITHDRAW_ROLE, "")) == []


def test_a_withdraw_that_undoes_an_admission_or_validates_is_refused() -> None:
    from test_machine_lint import REQUEST, edit

    both = WITHDRAW_TRANSITION.replace("accepted", "[accepted, processing]")
    running = edit(REQUEST, WITHDRAW_TRANSITION, both)
    assert _messages(running) == [
        "role-shape: role 'withdraw': trigger 'withdraw' must leave only the initial state "
        "'accepted' (an operator's cancel fires it to end a head still waiting for admission); "
        "it also leaves processing"
    ]
    to_green = WITHDRAW_TRANSITION.replace("cancelled", "succeeded")
    green = edit(REQUEST, WITHDRAW_TRANSITION, to_green)
    assert [m.split(" (")[0] for m in _messages(green)] == [
        "role-shape: role 'withdraw': trigger 'withdraw' must not lead to a state of the "
        "green outcome"
    ]


def test_retry_behind_a_newer_head_that_ended_names_that_one() -> None:
    w = world()
    w.ingest(Q, "A1")
    w.deliver_next()
    w.ingest(Q, "A2")
    do_cancel(w, A2)
    w.complete(A1, "failed")
    with pytest.raises(IllegalOperation, match=f"{A2} .* it ended cancelled: retry that one"):
        do_retry(w, A1)


def test_two_retries_at_once_make_one_request() -> None:
    w = world()
    w.ingest(Q, "A1")
    w.deliver_next()
    w.complete(A1, "failed")

    class RacingIndex:
        """The dedup index, with another operator's whole retry landing between this
        retry's read of the entry and its compare-and-set."""

        def __init__(self) -> None:
            self.other: object = None

        async def get(self, queue: str, uri: str) -> str | None:
            return await w.uri_index.get(queue, uri)

        async def put_if_absent(self, queue: str, uri: str, request_id: str) -> str:
            return await w.uri_index.put_if_absent(queue, uri, request_id)

        async def repoint(self, queue: str, uri: str, expected: str, request_id: str) -> str:
            if self.other is None:
                try:
                    self.other = await retry(lifecycle(w), w.stages.ingest, w.uri_index, A1)
                except IllegalOperation as refused:
                    self.other = refused
            return await w.uri_index.repoint(queue, uri, expected, request_id)

    index = RacingIndex()
    racing = replace_index(w, index)
    mine = run_sync(retry(lifecycle(w), racing, index, A1))
    # This retry minted A2 first: the other found the counter moved past A1 before the
    # entry was re-pointed, and was refused rather than take a second id.
    assert isinstance(index.other, IllegalOperation)
    assert mine.created and mine.request_id == A2
    with pytest.raises(NotFound):  # no second request was made
        run_sync(w.requests.get(A3))
    assert run_sync(w.requests.get(A2)).retry_of == A1
    assert run_sync(w.queues.get(Q)).latest_request_id == A2


def test_a_retry_that_finds_the_same_head_retried_since_joins_it() -> None:
    w = world()
    w.ingest(Q, "A1")
    w.deliver_next()
    w.complete(A1, "failed")
    first = run_sync(retry(lifecycle(w), w.stages.ingest, w.uri_index, A1))
    second = run_sync(retry(lifecycle(w), w.stages.ingest, w.uri_index, A1))
    assert first.created and not second.created
    assert first.request_id == second.request_id == A2


def test_a_retry_racing_a_new_head_never_takes_an_id_above_it() -> None:
    """A new head mints its id between the retry's check of ``latest`` and the retry's
    own mint (its row and ``latest`` not yet written): the retry is refused and writes
    nothing, so the new head stays the latest and is validated."""
    w = world()
    w.ingest(Q, "A1")
    w.deliver_next()
    w.complete(A1, "failed")
    counter = w.stages.ingest.counter

    class RacingCounter:
        async def next(self, queue: str) -> int:
            return await counter.next(queue)

        async def reserve(self, queue: str, count: int) -> int:
            return await counter.reserve(queue, count)

        async def next_after(self, queue: str, last: int) -> int | None:
            await counter.next(queue)  # a new head takes A2 right now
            return await counter.next_after(queue, last)

    racing = replace_index(w, w.uri_index)
    racing.counter = RacingCounter()  # type: ignore[assignment]
    with pytest.raises(IllegalOperation, match="backwards"):
        run_sync(retry(lifecycle(w), racing, w.uri_index, A1))
    assert run_sync(w.uri_index.get(Q, "A1")) == A1
    assert run_sync(w.queues.get(Q)).latest_request_id == A1
    with pytest.raises(NotFound):
        run_sync(w.requests.get(A3))


def replace_index(w: World, index: object):  # type: ignore[no-untyped-def]
    from stovepipe_fsm.pipeline.ingest import Ingest

    ingest = w.stages.ingest
    return Ingest(
        initial_state=ingest.initial_state,
        requests=ingest.requests,
        queues=ingest.queues,
        publisher=ingest.publisher,
        uri_index=index,  # type: ignore[arg-type]
        counter=ingest.counter,
        clock=ingest.clock,
        trail=ingest.trail,
    )


def test_verbs_refuse_a_policy_record_without_the_request_machine() -> None:
    from stovepipe_fsm.adapters.jetstream.policy_record import PolicyRecord
    from stovepipe_fsm.apps.service.verbs import recorded_lifecycle

    older = PolicyRecord("cafe", 0, "r", request_initial="accepted", withdraw="withdraw")
    clock = World(MACHINES, StaticConfigStore({})).clock
    with pytest.raises(IllegalOperation, match="no service has recorded the policy in force"):
        recorded_lifecycle(None, None, clock)  # type: ignore[arg-type]
    with pytest.raises(IllegalOperation, match=r"\(cafe\) .* record the request machine in"):
        recorded_lifecycle(older, None, clock)  # type: ignore[arg-type]
    broken = replace(older, request_machine="name: request\n")
    with pytest.raises(IllegalOperation, match=r"policy in force \(cafe\) does not load here"):
        recorded_lifecycle(broken, None, clock)  # type: ignore[arg-type]


def test_the_service_records_the_machine_it_runs_and_status_shows_the_rest() -> None:
    from stovepipe_fsm.apps.service.policy import policy_record

    record = policy_record(MACHINES, "cafe", "replica", 7)
    assert record.request_machine == MACHINES.request.spec.source
    facts = (record.hash, record.request_initial, record.withdrawn)
    assert facts == ("cafe", "accepted", "cancelled")
    shown = record.shown()
    assert "request_machine" not in shown and shown["hash"] == "cafe"


def test_a_queue_that_validates_every_head_retries_one_behind_a_newer_head() -> None:
    serial = ROOT / "examples/policies/serial_every_head"
    machines = load_process_machines(serial / "machines")
    config = load_queue_config(serial / "config" / "queues.yaml", parameters=machines.parameters)
    keeps_every_head = dict(config.resolve(Q).parameters)
    assert MACHINES.coalesces and machines.coalesces  # the shipped gate, either way
    assert queue_coalesces(MACHINES.coalesces, dict(MACHINES.parameter_defaults))
    assert not queue_coalesces(machines.coalesces, keeps_every_head)
    w = world()
    w.ingest(Q, "A1")
    w.deliver_next()
    w.complete(A1, "failed")
    w.ingest(Q, "A2")
    again = run_sync(
        retry(
            lifecycle(w),
            w.stages.ingest,
            w.uri_index,
            A1,
            coalesces=queue_coalesces(machines.coalesces, keeps_every_head),
        )
    )
    assert again.created and again.request_id == A3
    assert run_sync(w.requests.get(A3)).retry_of == A1
    assert run_sync(w.requests.get(A2)).state == "accepted"  # still validated in turn
