"""Which policy the service has in force, kept in the service bucket.

``serve`` writes the record on start (before it consumes anything) and on every reload.
``status`` shows it; ``ingest`` takes the request machine's initial state from it,
``complete`` checks an outcome's name against it, ``prune`` takes the terminal states
from it and ``cancel``/``retry``/``dlq replay`` run the request machine itself (its YAML,
recorded with the policy hash), so none of them loads a policy file: an operator command
never depends on the machines in its working directory. One key: with several replicas
it names the policy of the replica that (re)loaded last, which is what an operator
rolling out an edit wants to see converge.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from ...domain.errors import NonRetryable
from .bulk import kv_snapshot
from .errors import translated
from .names import encode_queue_token
from .topology import Topology

POLICY_KEY = "policy"


@dataclass(frozen=True)
class PolicyRecord:
    """The policy hash in force, when it was loaded, by which replica, and the request
    machine's facts operator commands need (its initial state; each build outcome with
    the states it ends in). A record written before those facts existed reads them empty.
    """

    hash: str
    loaded_at_ms: int
    replica: str
    request_initial: str = ""
    outcomes: dict[str, list[str]] = field(default_factory=dict)
    terminal_states: list[str] = field(default_factory=list)
    #: The parameters the policy declares (``pause`` needs ``paused``).
    parameters: list[str] = field(default_factory=list)
    #: The outcome whose recording advances last green (``retry`` never retries it).
    green_outcome: str = ""
    #: The gate supersedes older heads (a record written before this was recorded: yes).
    coalesces: bool = True
    #: The trigger of the optional ``withdraw`` role and the state it leads to (``cancel``);
    #: empty when the policy declares none.
    withdraw: str = ""
    withdrawn: str = ""
    #: The states the optional ``preempt`` role leads to (an outcome for a request in one
    #: is moot); empty when the policy declares none.
    preempted: list[str] = field(default_factory=list)
    #: The request machine's YAML text, as the service loaded it (the operator verbs
    #: compile and run it); empty in a record written before it was recorded.
    request_machine: str = ""
    #: When each part in force was loaded (0 in a record written before this was kept).
    machines_loaded_at_ms: int = 0
    config_loaded_at_ms: int = 0
    #: The last refused edit of the policy: ``part``, ``error`` (located), ``at_ms`` and
    #: ``now`` (still refused: the edit on disk is not in force); empty when none was.
    refused: dict[str, object] = field(default_factory=dict)

    def shown(self) -> dict[str, object]:
        """The record as ``status`` shows it: every fact but the machine's text."""
        shown = asdict(self)
        del shown["request_machine"]
        return shown


async def write_policy_record(
    js: JetStreamContext, topology: Topology, record: PolicyRecord
) -> None:
    with translated(f"write {topology.service_bucket} {POLICY_KEY}"):
        kv = await js.key_value(topology.service_bucket)
        await kv.put(POLICY_KEY, json.dumps(asdict(record), sort_keys=True).encode())


async def read_policy_record(js: JetStreamContext, topology: Topology) -> PolicyRecord | None:
    """The record, or None when no service has written one (or the bucket is missing)."""
    with translated(f"read {topology.service_bucket} {POLICY_KEY}"):
        try:
            kv = await js.key_value(topology.service_bucket)
            entry = await kv.get(POLICY_KEY)
        except (nats.js.errors.BucketNotFoundError, nats.js.errors.KeyNotFoundError):
            return None
    if not entry.value:
        return None
    try:
        data = json.loads(entry.value)
        return PolicyRecord(
            str(data["hash"]),
            int(data["loaded_at_ms"]),
            str(data["replica"]),
            request_initial=str(data.get("request_initial", "")),
            outcomes={
                str(name): [str(state) for state in states]
                for name, states in dict(data.get("outcomes", {})).items()
            },
            terminal_states=[str(state) for state in data.get("terminal_states", [])],
            parameters=[str(name) for name in data.get("parameters", [])],
            green_outcome=str(data.get("green_outcome", "")),
            coalesces=bool(data.get("coalesces", True)),
            withdraw=str(data.get("withdraw", "")),
            withdrawn=str(data.get("withdrawn", "")),
            preempted=[str(state) for state in data.get("preempted", [])],
            request_machine=str(data.get("request_machine", "")),
            machines_loaded_at_ms=int(data.get("machines_loaded_at_ms", 0)),
            config_loaded_at_ms=int(data.get("config_loaded_at_ms", 0)),
            refused=_refused(data.get("refused") or {}),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise NonRetryable(f"{topology.service_bucket} {POLICY_KEY} is damaged: {exc}") from None


def _refused(data: object) -> dict[str, object]:
    if not isinstance(data, dict) or not data:
        return {}
    return {
        "part": str(data["part"]),
        "error": str(data["error"]),
        "at_ms": int(data["at_ms"]),
        "now": bool(data.get("now", False)),
    }


QUEUE_KEY_PREFIX = "queue."


async def write_queue_parameters(
    js: JetStreamContext,
    topology: Topology,
    queue: str,
    parameters: dict[str, object],
    kv: KeyValue | None = None,
) -> None:
    """The effective parameters the service resolved for ``queue`` (what ``status`` shows);
    ``kv``: the service bucket, when the caller opened it already."""
    key = QUEUE_KEY_PREFIX + encode_queue_token(queue)
    body = json.dumps({"queue": queue, "parameters": parameters}, sort_keys=True, default=str)
    with translated(f"write {topology.service_bucket} {key}"):
        if kv is None:
            kv = await js.key_value(topology.service_bucket)
        await kv.put(key, body.encode())


def stored_parameters(parameters: dict[str, object]) -> dict[str, object]:
    """``parameters`` as :func:`read_queue_parameters` reads them back once written."""
    stored: dict[str, object] = json.loads(json.dumps(parameters, sort_keys=True, default=str))
    return stored


async def read_queue_parameters(
    js: JetStreamContext, topology: Topology
) -> dict[str, dict[str, object]]:
    """Every queue's effective parameters the service wrote (queue -> name -> value):
    one pass over the queue keys' latest values, not a listing and then a get per key."""
    pairs = await kv_snapshot(js, topology.service_bucket, QUEUE_KEY_PREFIX + ">")
    return queue_parameters(pairs)


def queue_parameters(values: Iterable[tuple[str, bytes]]) -> dict[str, dict[str, object]]:
    """The effective parameters in ``(key, value)`` pairs of the service bucket (other
    keys are passed over; a damaged value too: status shows no parameters for it)."""
    out: dict[str, dict[str, object]] = {}
    for key, value in values:
        if not key.startswith(QUEUE_KEY_PREFIX):
            continue
        try:
            data = json.loads(value or b"{}")
            out[str(data["queue"])] = dict(data["parameters"])
        except (ValueError, KeyError, TypeError):
            continue
    return out
