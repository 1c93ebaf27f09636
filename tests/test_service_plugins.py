"""On a real nats-server: a plugin condition that blocks does not hold the service.

The freeze-window fixture policy, with its condition made to block while a file exists:
the delivery that asks it fails retryably once the budget is spent, while the condition
still blocks, and the service's event loop answers meanwhile (its health, its metrics,
this test's own awaits); once the condition returns, the head is admitted.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from test_service_support import running_service, wait_for

from stovepipe_fsm.apps.service.http import render_metrics
from stovepipe_fsm.process.catalog import load_process_machines

ROOT = Path(__file__).resolve().parent
FREEZE = ROOT / "fixtures" / "plugins" / "freeze_window"
QUEUE = "team/app"
CONFIG = {"defaults": {"gate_wait_delay_ms": 100}}

BLOCKING_CONDITION = '''
        import os, time
        give_up = time.monotonic() + 20  # a bound, should the test fail with it held
        while os.path.exists({flag!r}) and time.monotonic() < give_up:
            time.sleep(0.02)
        return False
'''


def blocking_policy(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the freeze-window policy whose condition blocks while ``flag`` exists."""
    policy = tmp_path / "policy"
    shutil.copytree(FREEZE, policy)
    flag = tmp_path / "blocked"
    rules = policy / "freeze_rules.py"
    text = rules.read_text(encoding="utf-8")
    body = (
        "        hour = ctx.now_ms() % DAY_MS // HOUR_MS\n"
        "        return hour in FREEZE_HOURS_UTC\n"
    )
    assert body in text, "the fixture's condition changed; update this test's edit"
    rules.write_text(text.replace(body, BLOCKING_CONDITION.format(flag=str(flag))[1:]))
    return policy, flag


async def test_a_blocking_plugin_condition_fails_its_delivery_and_the_service_goes_on(
    js_env, tmp_path: Path
) -> None:
    policy, flag = blocking_policy(tmp_path)
    machines = load_process_machines(policy / "machines")
    machines.queue_gate.watch.budget_s = 0.3
    flag.touch()
    async with running_service(js_env.server, js_env.topology, CONFIG, policy=machines) as run:
        request_id = await run.ingest(QUEUE, "A")

        async def over_budget() -> bool:
            return bool(machines.queue_gate.watch.over_budget)

        await wait_for(over_budget, "a delivery failing past the plugin's budget")
        assert flag.exists(), "it failed while the condition still blocked"
        # The event loop is free: the service answers, this test runs.
        assert run.service.health.problems() == []
        text = await render_metrics(run.service)
        [line] = [ln for ln in text.splitlines() if ln.startswith("stovepipe_plugin_over_budget")]
        assert "queue_gate.yaml:" in line and "in machine 'queue_gate'" in line
        flag.unlink()
        await asyncio.wait_for(run.wait_state(request_id, "processing"), 30)
