"""``stovepipe-fsm``: the command line.

Exit codes: 0 success; 1 the checked thing is wrong (validate found issues, diagrams
stale, a model-check counterexample) or the broker refused or could not be reached;
2 bad input (an invalid file or argument, a file that cannot be read or written, or the
``nats`` extra missing for a JetStream command); 3 an unexpected error, which is a bug.
Errors in input files name ``file:line:column``. No traceback reaches a user: an
unexpected error is one line naming the exception (``STOVEPIPE_FSM_TRACEBACK=1`` prints
the traceback as well).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from ..located.errors import SpecError, SpecIssue
from ..machine.loader import LoadedPolicy, present_machine_files
from ..machine.model import MachineSpec, ParameterSpec
from .options import (
    DEFAULT_CONFIG,
    DEFAULT_MACHINES,
    DIAGRAM_DIRS,
    EXIT_FAIL,
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_USAGE,
    MACHINES_HELP,
    first_existing,
    installed_version,
    machines_of_config,
)

TRACEBACK_ENV = "STOVEPIPE_FSM_TRACEBACK"
CARD_CONFIG_HELP = (
    "the queue config the policy card is drawn from (default: P/config/queues.yaml for "
    "--machines P/machines when it exists, else config/queues.yaml here, else the shipped one)"
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.handler(args))
    except SpecError as exc:
        for issue in exc.issues:
            print(issue, file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into a pager or head that closed early
        sys.stderr.close()
        return EXIT_OK
    except OSError as exc:  # a path given on the command line cannot be read or written
        print(f"error: {_os_error_text(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:
        if os.environ.get(TRACEBACK_ENV):
            traceback.print_exc()
        print(
            f"error: unexpected {type(exc).__name__}: {exc} (a bug in stovepipe-fsm; "
            f"{TRACEBACK_ENV}=1 prints the traceback)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


def _os_error_text(exc: OSError) -> str:
    """``No such file or directory: 'out/x.yaml'`` rather than the ``[Errno 2]`` form."""
    if exc.strerror and exc.filename is not None:
        return f"{exc.strerror}: {str(exc.filename)!r}"
    return str(exc)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stovepipe-fsm",
        description="Process stage of a trunk-validation pipeline, declared as YAML machines.",
    )
    version = f"stovepipe-fsm {installed_version()}"
    parser.add_argument("--version", action="version", version=version)
    sub = parser.add_subparsers(metavar="COMMAND")

    p = sub.add_parser("validate", help="schema + lint of machines and queue config")
    p.add_argument("paths", nargs="*", help="files or directories (default: the shipped ones)")
    p.add_argument(
        "--format", choices=("text", "json"), default="text", help="how issues are printed"
    )
    p.add_argument(
        "--machines",
        help="where the parameters a config file may set are declared (default: the "
        "machines of the config's own policy directory, P/machines for "
        "P/config/queues.yaml, else those validated in the same run, else machines)",
    )
    p.set_defaults(handler=cmd_validate)

    p = sub.add_parser(
        "diagram", help="write state diagrams and the policy card to docs/diagrams"
    )
    p.add_argument("--machines", default=DEFAULT_MACHINES, help=MACHINES_HELP)
    p.add_argument("--config", help=CARD_CONFIG_HELP)
    p.add_argument(
        "--out",
        help=f"default: the first of {', '.join(DIAGRAM_DIRS)} that exists, else {DIAGRAM_DIRS[0]}",
    )
    p.add_argument(
        "--check", action="store_true", help="exit 1 if the diagrams or the card are stale"
    )
    p.add_argument(
        "--svg",
        action="store_true",
        help="also lay each diagram out as SVG (needs Graphviz dot); with --check, check them",
    )
    p.set_defaults(handler=cmd_diagram)

    p = sub.add_parser(
        "card",
        help="print the policy card: per queue pattern, the effective parameters and the "
        "gate transitions that can fire under them",
    )
    p.add_argument("--machines", default=DEFAULT_MACHINES, help=MACHINES_HELP)
    p.add_argument("--config", help=CARD_CONFIG_HELP)
    p.add_argument(
        "--queue", help="one queue, resolved as the service would (default: every pattern)"
    )
    p.set_defaults(handler=cmd_card)

    for register in _extensions():
        register(sub)
    return parser


def _extensions() -> list[Callable[[argparse._SubParsersAction], None]]:  # type: ignore[type-arg]
    """Subcommands that live in their own modules: ``simulate``, ``whatif``, ``test``,
    ``check``, and the service with its operator commands."""
    from .check.command import register as register_check
    from .policytest.command import register as register_test
    from .service.command import register as register_service
    from .simulate.command import register as register_simulate
    from .whatif.command import register as register_whatif

    return [register_simulate, register_whatif, register_test, register_check, register_service]


# --- validate -----------------------------------------------------------------------


def default_validate_paths() -> list[Path]:
    machines = present_machine_files(DEFAULT_MACHINES)
    return [*(Path(DEFAULT_MACHINES) / name for name in machines), Path(DEFAULT_CONFIG)]


def cmd_validate(args: argparse.Namespace) -> int:
    from ..config.loader import check_queue_config
    from ..located.yaml_source import read_yaml

    paths: list[Path] = []
    for raw in args.paths or default_validate_paths():
        path = Path(raw)
        if path.is_dir():
            found = sorted(path.glob("*.yaml")) + sorted(path.glob("*.yml"))
            if not found:
                print(f"{path}: no .yaml files to validate", file=sys.stderr)
                return EXIT_USAGE
            paths += found
        else:
            paths.append(path)
    kinds = {path: _file_kind(path, read_yaml) for path in paths}
    policies: dict[Path, list[Path]] = {}  # machine files by directory: one policy each
    shown: dict[Path, str] = {}  # each such directory as the command line names it
    for path in paths:
        if kinds[path] == "machine":
            policies.setdefault(path.resolve().parent, []).append(path)
            shown.setdefault(path.resolve().parent, str(path.parent))
    checked = {directory: _check_policy_files(files) for directory, files in policies.items()}
    unreadable = sum(count for _, _, count in checked.values())
    issues: list[SpecIssue] = []
    reported: set[Path] = set()
    for path in paths:  # in the order given; a policy is reported at its first file
        if kinds[path] == "config":
            against, declarations = _declarations_for(path, args.machines, checked, shown)
            if against:  # not the policy's own machines validated beside it: say whose
                print(f"{path}: checked against the machines in {against}", file=sys.stderr)
            # A machine file of this run that did not load declares nothing we can see:
            # flagging the keys it may declare would only repeat that one mistake.
            issues += check_queue_config(
                path, parameters=declarations, other_keys=bool(unreadable)
            )
        elif (directory := path.resolve().parent) not in reported:
            reported.add(directory)
            issues += checked[directory][1]
    if args.format == "json":
        doc = {"files": [str(p) for p in paths], "issues": [i.as_dict() for i in issues]}
        print(json.dumps(doc, indent=2))
    else:
        for issue in issues:
            print(issue)
        status = f"{len(issues)} issue(s)" if issues else "ok"
        print(f"validated {len(paths)} file(s): {status}", file=sys.stderr)
    return EXIT_FAIL if issues else EXIT_OK


def _check_policy_files(files: list[Path]) -> tuple[list[MachineSpec], list[SpecIssue], int]:
    """The machine files of one directory, as one policy: its plugins are imported from
    the directory above (the policy directory). Returns the specs that parsed, every
    issue, and how many files did not parse."""
    from ..machine.loader import across_machines
    from ..process.catalog import check_policy

    specs, issues = check_policy(files, policy_dir=files[0].resolve().parent.parent)
    names: dict[str, str] = {}
    unique: list[MachineSpec] = []
    for spec in specs:
        if spec.name in names:
            used = f"machine name {spec.name!r} is already used by {names[spec.name]}"
            message = f"{used}; names must be unique"
            issues.append(SpecIssue(spec.location, message, "duplicate-machine"))
        else:
            names[spec.name] = spec.file
            unique.append(spec)
    issues += across_machines(unique)
    return specs, issues, len(files) - len(specs)


def _declarations_for(
    config: Path,
    machines: str | None,
    checked: dict[Path, tuple[list[MachineSpec], list[SpecIssue], int]],
    shown: dict[Path, str],
) -> tuple[str, dict[str, ParameterSpec] | None]:
    """Which machines declare what ``config`` may set, and their declarations.

    ``--machines`` when given; else the machines of the config's own policy directory
    (validated in this run, or loaded now); else the machine files of this run; else the
    default machines directory. The first is ``""`` for the policy's own machines
    validated in this run (nothing to point out), else the machines directories.
    """
    from ..machine.parameters import declared_parameters

    if machines is not None:
        return machines, _declared_in(machines)
    own = machines_of_config(config)
    if own is not None:
        in_run = checked.get(own.resolve())
        if in_run is not None:
            return "", declared_parameters(in_run[0])
        return str(own), _declared_in(str(own))
    specs = [spec for found, _, _ in checked.values() for spec in found]
    if specs:
        return ", ".join(shown[d] for d in checked), declared_parameters(specs)
    return DEFAULT_MACHINES, _declared_in(DEFAULT_MACHINES)


def _declared_in(machines: str) -> dict[str, ParameterSpec] | None:
    """The parameters the machines in ``machines`` declare; ``None`` (any key accepted)
    when they do not load, which ``validate`` of those files would report."""
    from ..process.catalog import load_process_machines

    try:
        return dict(load_process_machines(machines).parameters)
    except (SpecError, OSError) as exc:
        print(
            f"note: the machines in {machines} did not load ({type(exc).__name__}); "
            "parameter names and values in config files are not checked",
            file=sys.stderr,
        )
        return None


def _file_kind(path: Path, read_yaml) -> str:  # type: ignore[no-untyped-def]
    try:
        data = read_yaml(path).data
    except SpecError:
        return "machine"  # the machine check reports the same syntax error with location
    if isinstance(data, dict):
        if {"transitions", "states", "initial"} & set(data):
            return "machine"
        if {"defaults", "queues"} & set(data):
            return "config"
    return "config" if "queues" in path.stem else "machine"


# --- diagram ------------------------------------------------------------------------


def cmd_diagram(args: argparse.Namespace) -> int:
    from ..process.catalog import load_policy
    from .diagram_files import (
        DiagramError,
        DiagramFiles,
        diagram_files,
        stale_diagrams,
        write_diagrams,
    )
    from .policy_card import CARD_FILE

    policy = load_policy(args.machines)
    try:
        files = diagram_files(policy.specs, policy.registries, svg=args.svg)
    except DiagramError as exc:
        print(f"stovepipe-fsm diagram: {exc}", file=sys.stderr)
        return EXIT_USAGE
    files = DiagramFiles({**files.contents, CARD_FILE: _card(args, policy)}, files.suffixes)
    out_dir = Path(args.out or first_existing(DIAGRAM_DIRS) or DIAGRAM_DIRS[0])
    rerun = "stovepipe-fsm diagram --svg" if args.svg else "stovepipe-fsm diagram"
    if args.check:
        stale = stale_diagrams(files, out_dir)
        if stale:
            for name in stale:
                print(f"{out_dir / name}: stale; run `{rerun}`", file=sys.stderr)
            return EXIT_FAIL
        print(f"diagrams in {out_dir} are up to date", file=sys.stderr)
        return EXIT_OK
    try:
        written = write_diagrams(files, out_dir)
    except OSError as exc:
        where = exc.filename or out_dir
        print(f"{where}: cannot write diagrams: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    for path in written:
        print(f"wrote {path}")
    if not written:
        print(f"diagrams in {out_dir} are up to date", file=sys.stderr)
    return EXIT_OK


# --- card ---------------------------------------------------------------------------


def card_config(machines: str, config: str | None) -> str:
    """The config a policy card is drawn from (see ``--config``)."""
    if config:
        return config
    beside = Path(machines).parent / "config" / "queues.yaml"
    return str(beside) if Path(machines).name == "machines" and beside.is_file() else DEFAULT_CONFIG


def _card(args: argparse.Namespace, loaded: LoadedPolicy, queue: str | None = None) -> str:
    """The policy card of the machines ``loaded`` (from ``args.machines``, loaded once by
    the caller) under the config ``args`` names."""
    from ..config.loader import load_queue_config
    from ..machine.parameters import declared_parameters, defaults_of
    from .policy_card import render_card

    parameters = declared_parameters(loaded.specs.values())
    config = card_config(args.machines, args.config)
    policy = load_queue_config(config, parameters=parameters)
    return render_card(
        loaded.specs["queue_gate"],
        loaded.registries["queue_gate"],
        policy,
        defaults_of(parameters),
        config_name=config,
        queue=queue,
    )


def cmd_card(args: argparse.Namespace) -> int:
    from ..domain.queue_names import InvalidQueueName, normalize_queue_name

    queue = None
    if args.queue:
        try:
            queue = normalize_queue_name(args.queue)
        except InvalidQueueName as exc:
            print(f"error: --queue: {exc}", file=sys.stderr)
            return EXIT_USAGE
    from ..process.catalog import load_policy

    sys.stdout.write(_card(args, load_policy(args.machines), queue))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
