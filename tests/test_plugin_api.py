"""The public plugin API: ``stovepipe_fsm.plugin`` is all a plugin uses, and it is enough.

- every example plugin (examples/policies, tests/fixtures/plugins) imports nothing of the
  package but ``stovepipe_fsm.plugin`` (its imports parsed, not grepped);
- docs/plugin-api.md is the page generated from the module, and docs/machines.md links
  it and walks a new user through writing a policy;
- a plugin's trail note is in the trail once per request version and ``explain`` says
  it; scratch lives for one delivery;
- a plugin that raises is reported by ``test`` and ``simulate`` with its own line and
  the YAML step that called it.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest
from memory_stages import memory_stages

from stovepipe_fsm import plugin
from stovepipe_fsm.adapters.memory import (
    MemoryDelivery,
    MemorySourceControl,
    MemorySourceControlProvider,
)
from stovepipe_fsm.apps import plugin_reference
from stovepipe_fsm.apps.cli import main
from stovepipe_fsm.apps.options import load_policy_store
from stovepipe_fsm.domain import errors
from stovepipe_fsm.domain.entities import Queue, Request
from stovepipe_fsm.domain.trail_record import PLUGIN, TrailRecord
from stovepipe_fsm.machine.compiler import IllegalTransition
from stovepipe_fsm.machine.registry import RegistrationRefused
from stovepipe_fsm.process.catalog import REGISTRIES, load_process_machines
from stovepipe_fsm.process.context import DeliveryContext
from stovepipe_fsm.process.plugin_context import PluginContext
from stovepipe_fsm.process.plugins import PluginRegistry
from stovepipe_fsm.process.trail_notes import note_plugin
from stovepipe_fsm.simulation.replay import simulate
from stovepipe_fsm.simulation.timeline import load_timeline
from stovepipe_fsm.simulation.world import World
from stovepipe_fsm.views.explain import history_json, render_history, sentence

ROOT = Path(__file__).resolve().parent.parent
EMBARGO = ROOT / "examples" / "policies" / "embargo_plugin"
PUBLIC = "stovepipe_fsm.plugin"


def example_plugins() -> list[Path]:
    return sorted(
        [*ROOT.glob("examples/policies/*/*.py"), *ROOT.glob("tests/fixtures/plugins/**/*.py")]
    )


def reaches_past_the_api(source: str) -> list[str]:
    """The imports of ``source`` that name a module of the package other than the API."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            if node.module == "stovepipe_fsm":
                names = [f"stovepipe_fsm.{alias.name}" for alias in node.names]
        else:
            continue
        found += [
            f"line {node.lineno}: {name}"
            for name in names
            if name.partition(".")[0] == "stovepipe_fsm" and name != PUBLIC
        ]
    return found


def test_the_import_check_catches_every_form() -> None:
    assert reaches_past_the_api("from stovepipe_fsm.plugin import PluginContext\n") == []
    assert reaches_past_the_api("from stovepipe_fsm import plugin\n") == []
    assert reaches_past_the_api("import stovepipe_fsm.plugin\n") == []
    bad = (
        "import os\n"
        "from stovepipe_fsm.process.plugins import PluginRegistry\n"
        "import stovepipe_fsm.domain.errors\n"
        "from stovepipe_fsm import process\n"
        "def f():\n"
        "    from stovepipe_fsm.process.context import DeliveryContext\n"
    )
    assert reaches_past_the_api(bad) == [
        "line 2: stovepipe_fsm.process.plugins",
        "line 3: stovepipe_fsm.domain.errors",
        "line 4: stovepipe_fsm.process",
        "line 6: stovepipe_fsm.process.context",
    ]


def test_example_plugins_use_only_the_public_api() -> None:
    plugins = example_plugins()
    assert {p.name for p in plugins} >= {"embargo_rules.py", "freeze_rules.py"}
    for path in plugins:
        assert reaches_past_the_api(path.read_text(encoding="utf-8")) == [], path


def test_every_public_name_exists_and_is_documented() -> None:
    for name in plugin.__all__:
        value = getattr(plugin, name)
        if not isinstance(value, str):
            assert (value.__doc__ or "").strip(), name
    # The API's exceptions are the ones the ports raise: catching them catches those.
    assert plugin.NotFound is errors.NotFound
    assert plugin.Retryable is errors.Retryable
    assert plugin.NonRetryable is errors.NonRetryable


# --- the reference page and the walkthrough ----------------------------------------------


def test_the_reference_page_is_current() -> None:
    page = (ROOT / "docs" / "plugin-api.md").read_text(encoding="utf-8")
    assert page == plugin_reference.render(), (
        "docs/plugin-api.md is stale; run python -m stovepipe_fsm.apps.plugin_reference"
    )
    for name in plugin.__all__:
        assert f"`{name}`" in page, name


def test_the_reference_check_fails_on_a_stale_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plugin-api.md"
    assert plugin_reference.main(["--out", str(out), "--check"]) == 1  # missing
    assert plugin_reference.main(["--out", str(out)]) == 0
    assert plugin_reference.main(["--out", str(out), "--check"]) == 0
    out.write_text(out.read_text(encoding="utf-8").replace("scratch", "cache"), "utf-8")
    assert plugin_reference.main(["--out", str(out), "--check"]) == 1
    assert "stale" in capsys.readouterr().err


def test_machines_md_links_the_reference_and_walks_through_a_policy() -> None:
    text = (ROOT / "docs" / "machines.md").read_text(encoding="utf-8")
    assert "(plugin-api.md)" in text
    walkthrough = text.split("\n## Write your own policy\n", 1)[1].split("\n## ", 1)[0]
    for command in ("stovepipe-fsm validate", "stovepipe-fsm test", "stovepipe-fsm check"):
        assert command in walkthrough, command
    assert "from stovepipe_fsm.plugin import" in walkthrough


# --- trail notes and scratch ----------------------------------------------------------------


def embargo_world() -> World:
    timeline = load_timeline(EMBARGO / "timelines" / "embargo.yaml")
    return simulate(
        timeline,
        load_process_machines(EMBARGO / "machines"),
        load_policy_store(str(EMBARGO / "config" / "queues.yaml")),
    ).world


async def embargo_trail() -> tuple[list[TrailRecord], dict[str, str]]:
    world = embargo_world()
    assert world.trail is not None
    ids = {r.uri: r.id for r in world.requests.snapshot()}
    return await world.trail.history(ids["B-wip"]), ids


async def test_the_embargo_plugin_notes_the_glob_once_and_explain_shows_it() -> None:
    history, ids = await embargo_trail()
    notes = [r for r in history if r.kind == PLUGIN]
    # Held twice (a redelivery of the unchanged request): one note, not two.
    assert len(notes) == 1
    assert notes[0].details == {"plugin": "embargo_rules", "note": "embargoed", "glob": "*-wip"}
    said = sentence(notes[0])
    assert said == "plugin embargo_rules noted: embargoed (glob=*-wip)"
    assert said in render_history(None, history)
    assert said in [h["sentence"] for h in history_json(None, history)["history"]]
    assert [r.kind for r in history][-1] == "superseded"
    assert ids["C"]


def test_the_embargo_plugin_announces_its_declared_hook_once_per_held_request() -> None:
    world = embargo_world()
    ids = {r.uri: r.id for r in world.requests.snapshot()}
    events = [published.event() for published in world.published.hooks()]
    held = [e for e in events if e.type == "embargo.head.held"]
    assert {e.id for e in held} == {held[0].id}  # held twice: one id, so consumers dedupe
    assert held[0].payload == {
        "queue": "monorepo/main",
        "request_id": ids["B-wip"],
        "glob": "*-wip",
    }


async def test_a_plugin_announces_only_the_hooks_it_declared() -> None:
    registry = PluginRegistry(REGISTRIES)
    with pytest.raises(RegistrationRefused, match="the stage's own"):
        registry.hooks.declare("validation.repository.embargoed")
    with pytest.raises(RegistrationRefused, match="dotted lower-case"):
        registry.hooks.declare("Embargo")
    declared = registry.hooks.declare("team.embargo.held")
    ctx = DeliveryContext(services=None, delivery=None, request_id="r")  # type: ignore[arg-type]
    ctx.loaded_request = Request(id="request/q/1", queue="q", uri="A", state="accepted")
    with pytest.raises(ValueError, match="not declared by plugin p"):
        await PluginContext(ctx, "p", registry.hooks.types).announce("team.other")
    with pytest.raises(ValueError, match="may not set queue"):
        await PluginContext(ctx, "p", registry.hooks.types).announce(declared, queue="x")


async def test_a_trail_note_may_not_overwrite_what_it_records() -> None:
    ctx = DeliveryContext(services=None, delivery=None, request_id="r")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="may not use"):
        await note_plugin(ctx, "p", "x", plugin="other")


def test_scratch_lives_for_one_delivery() -> None:
    one = DeliveryContext(services=None, delivery=None, request_id="r")  # type: ignore[arg-type]
    two = DeliveryContext(services=None, delivery=None, request_id="r")  # type: ignore[arg-type]
    PluginContext(one, "p").scratch["seen"] = True
    assert PluginContext(one, "p").scratch == {"seen": True}  # a later step, same delivery
    assert PluginContext(two, "p").scratch == {}  # the next delivery starts empty


# --- a plugin that raises ----------------------------------------------------------------


BROKEN = {
    # a condition, called synchronously by the machine
    "condition": ("return bool(matching_glob(ctx))", "return bool(ctx.request.changed_paths)"),
    # an async action
    "action": ('ctx.count("embargo_holds")', "ctx.count_holds()"),
}


@pytest.mark.parametrize("step", sorted(BROKEN))
@pytest.mark.parametrize("command", ["test", "simulate"])
def test_a_plugin_error_names_its_own_line_and_the_yaml_step(
    step: str, command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy"
    shutil.copytree(EMBARGO, policy)
    rules = policy / "embargo_rules.py"
    old, new = BROKEN[step]
    source = rules.read_text(encoding="utf-8")
    assert old in source
    rules.write_text(source.replace(old, new), encoding="utf-8")
    line = next(n for n, text in enumerate(source.splitlines(), 1) if old in text)
    gate = (policy / "machines" / "queue_gate.yaml").read_text(encoding="utf-8").splitlines()
    named = "conditions: embargoed" if step == "condition" else "after: [count_embargo_hold"
    yaml_line = next(n for n, text in enumerate(gate, 1) if named in text)
    timeline = str(policy / "timelines" / "embargo.yaml")
    policy_args = ["--machines", str(policy / "machines")]
    policy_args += ["--config", str(policy / "config" / "queues.yaml")]
    main([command, timeline, *policy_args])
    out, err = capsys.readouterr()
    said = out + err
    assert f"raised in plugin code at {rules}:{line} in " in said, said
    assert re.search(rf"queue_gate\.yaml:{yaml_line}:\d+: in machine 'queue_gate'", said), said
    assert "AttributeError" in said


# --- the walkthrough, followed ----------------------------------------------------------


def walkthrough_blocks() -> dict[str, list[str]]:
    text = (ROOT / "docs" / "machines.md").read_text(encoding="utf-8")
    section = text.split("\n## Write your own policy\n", 1)[1].split("\n## ", 1)[0]
    blocks: dict[str, list[str]] = {}
    for lang, body in re.findall(r"```(\w+)\n(.*?)```", section, re.S):
        blocks.setdefault(lang, []).append(_dedent(body))
    return blocks


def _dedent(body: str) -> str:
    lines = body.splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return "\n".join(line[indent:] for line in lines) + "\n"


def follow_the_walkthrough(policy: Path) -> None:
    """Steps 1-5 of "Write your own policy": the code and the timeline as the page shows
    them, the YAML edits as step 3 describes them."""
    blocks = walkthrough_blocks()
    shutil.copytree(ROOT / "machines", policy / "machines")
    shutil.copytree(ROOT / "config", policy / "config")
    (policy / "quiet_rules.py").write_text(blocks["python"][0], encoding="utf-8")
    timeline = next(b for b in blocks["yaml"] if b.startswith("queue:"))
    (policy / "timelines").mkdir()
    (policy / "timelines" / "quiet.yaml").write_text(timeline, encoding="utf-8")
    shown = next(b for b in blocks["yaml"] if b.startswith("initial:"))
    parameter = shown.split("  # ... the shipped parameters, then:\n", 1)[1].split("transitions:")[
        0
    ]
    transition = shown.split("  # ... before the first `trigger: gate`:\n", 1)[1].split("  # ...")[
        0
    ]
    gate = policy / "machines" / "queue_gate.yaml"
    edits = [
        ("initial: received\n", "initial: received\nplugins: [quiet_rules]\n"),
        ("states:\n", parameter + "states:\n"),
        ("  - trigger: gate\n", transition + "  - trigger: gate\n"),
        (
            "    conditions: only_skip_paths_changed\n",
            "    conditions: only_skip_paths_changed\n    unless: in_quiet_hours\n",
        ),
        (
            "    unless: only_skip_paths_changed\n",
            "    unless: [only_skip_paths_changed, in_quiet_hours]\n",
        ),
        (
            "unless: [only_skip_paths_changed, gate_closed]\n",
            "unless: [only_skip_paths_changed, gate_closed, in_quiet_hours]\n",
        ),
        (
            "unless: [only_skip_paths_changed, gate_closed, baseline_lag_exceeded]\n",
            "unless: [only_skip_paths_changed, gate_closed, baseline_lag_exceeded, "
            "in_quiet_hours]\n",
        ),
    ]
    text = gate.read_text(encoding="utf-8")
    for old, new in edits:
        assert text.count(old) >= 1, old
        text = text.replace(old, new, 1)
    gate.write_text(text, encoding="utf-8")
    config = policy / "config" / "queues.yaml"
    old = "monorepo/main: {max_concurrent: 1}"
    assert old in config.read_text(encoding="utf-8")
    config.write_text(
        config.read_text(encoding="utf-8").replace(
            old, "monorepo/main: {max_concurrent: 1, quiet_hours_utc: [0]}"
        ),
        encoding="utf-8",
    )


def test_the_walkthrough_validates_tests_and_checks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "my_policy"
    follow_the_walkthrough(policy)
    machines, config = str(policy / "machines"), str(policy / "config" / "queues.yaml")
    assert main(["validate", machines, config]) == 0, capsys.readouterr()
    code = main(["test", str(policy / "timelines"), "--machines", machines, "--config", config])
    out, err = capsys.readouterr()
    assert code == 0 and "1 passed, 0 failed" in err, out + err
    small = ["--heads", "2", "--max-concurrent", "1", "--jobs", "1", "--quiet"]
    out_file = str(tmp_path / "counterexample.yaml")
    policy_args = ["--machines", machines, "--config", config, "--queue", "mobile/app"]
    code = main(["check", *policy_args, *small, "--out", out_file])
    out = capsys.readouterr().out
    assert code == 0 and "ok: every invariant holds" in out, out


async def test_a_plugin_reads_the_paths_a_commit_changed_since_its_parent_and_since_green() -> (
    None
):
    graph = MemorySourceControl(
        {"G": [], "P": ["G"], "H": ["P"]}, {"P": ["lib/a.py"], "H": ["docs/x.md"]}
    )
    stages = memory_stages(
        load_process_machines(ROOT / "machines"),
        source_control=MemorySourceControlProvider(default=graph),
    )
    ctx = DeliveryContext(stages.services, MemoryDelivery("q/main", "request/q/main/1"), "r")
    ctx.loaded_request = Request(id="request/q/main/1", queue="q/main", uri="H", state="accepted")
    ctx.loaded_queue = Queue("q/main", last_green_uri="G")
    view = PluginContext(ctx, "p")
    assert await view.changed_paths_since_parent() == {"docs/x.md"}
    assert await view.changed_paths_since_green() == {"lib/a.py", "docs/x.md"}
    ctx.loaded_request = Request(id="request/q/main/1", queue="q/main", uri="G", state="accepted")
    with pytest.raises(errors.NotFound, match="root commit"):
        await view.changed_paths_since_parent()


async def test_a_plugin_action_ends_a_waiting_request_through_the_lifecycle() -> None:
    stages = memory_stages(load_process_machines(ROOT / "machines"))
    requests = stages.services.requests
    waiting = Request(id="request/q/main/1", queue="q/main", uri="A", state="accepted")
    await requests.create(waiting)
    await stages.services.queues.create(Queue("q/main", latest_request_id=waiting.id))
    ctx = DeliveryContext(stages.services, MemoryDelivery("q/main", waiting.id), waiting.id)
    ctx.loaded_request = waiting
    view = PluginContext(ctx, "p")
    with pytest.raises(ValueError, match="not 'admit'"):
        await view.end_as("admit")
    ended = await view.end_as("skip")
    assert ended.state == "skipped" == (await requests.get(waiting.id)).state
    assert view.request == ended  # later steps of the delivery see the ended request
    with pytest.raises(IllegalTransition):  # no longer waiting: the machine refuses
        await view.end_as("withdraw")
