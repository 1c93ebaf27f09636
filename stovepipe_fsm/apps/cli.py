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

from ..spec.errors import SpecError, SpecIssue
from .options import DEFAULT_CONFIG, DEFAULT_MACHINES, EXIT_FAIL, EXIT_INTERNAL, EXIT_OK, EXIT_USAGE

TRACEBACK_ENV = "STOVEPIPE_FSM_TRACEBACK"
DEFAULT_DIAGRAMS = "docs/diagrams"


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
    sub = parser.add_subparsers(metavar="COMMAND")

    p = sub.add_parser("validate", help="schema + lint of machines and queue config")
    p.add_argument("paths", nargs="*", help="files or directories (default: the shipped ones)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(handler=cmd_validate)

    p = sub.add_parser("diagram", help="write state diagrams to docs/diagrams")
    p.add_argument("--machines", default=DEFAULT_MACHINES)
    p.add_argument("--out", default=DEFAULT_DIAGRAMS)
    p.add_argument("--check", action="store_true", help="exit 1 if the diagrams are stale")
    p.add_argument(
        "--svg",
        action="store_true",
        help="also lay each diagram out as SVG (needs Graphviz dot); with --check, check them",
    )
    p.set_defaults(handler=cmd_diagram)

    for register in _extensions():
        register(sub)
    return parser


def _extensions() -> list[Callable[[argparse._SubParsersAction], None]]:  # type: ignore[type-arg]
    """Subcommands that live in their own modules: ``simulate``, ``test``, ``check``, and
    the service with its operator commands."""
    from .check.command import register as register_check
    from .policytest.command import register as register_test
    from .service.command import register as register_service
    from .simulate.command import register as register_simulate

    return [register_simulate, register_test, register_check, register_service]


# --- validate -----------------------------------------------------------------------


def default_validate_paths() -> list[Path]:
    return [
        Path(DEFAULT_MACHINES) / "request.yaml",
        Path(DEFAULT_MACHINES) / "queue_gate.yaml",
        Path(DEFAULT_CONFIG),
    ]


def cmd_validate(args: argparse.Namespace) -> int:
    from ..config.loader import check_queue_config
    from ..process.catalog import REGISTRIES
    from ..spec.loader import check_machine
    from ..spec.yaml_source import read_yaml

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
    issues: list[SpecIssue] = []
    names: dict[str, str] = {}
    for path in paths:
        kind = _file_kind(path, read_yaml)
        if kind == "config":
            issues += check_queue_config(path)
            continue
        spec, found_issues = check_machine(path, REGISTRIES)
        issues += found_issues
        if spec is not None and spec.name in names:
            issues.append(
                SpecIssue(
                    spec.location,
                    f"machine name {spec.name!r} is already used by {names[spec.name]}; "
                    "names must be unique",
                    "duplicate-machine",
                )
            )
        elif spec is not None:
            names[spec.name] = spec.file
    if args.format == "json":
        print(
            json.dumps(
                {"files": [str(p) for p in paths], "issues": [i.as_dict() for i in issues]},
                indent=2,
            )
        )
    else:
        for issue in issues:
            print(issue)
        status = f"{len(issues)} issue(s)" if issues else "ok"
        print(f"validated {len(paths)} file(s): {status}", file=sys.stderr)
    return EXIT_FAIL if issues else EXIT_OK


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
    from ..process.catalog import REGISTRIES
    from ..spec.loader import load_machine_dir
    from .diagram_files import DiagramError, diagram_files, stale_diagrams, write_diagrams

    specs = load_machine_dir(args.machines, REGISTRIES)
    try:
        files = diagram_files(specs, REGISTRIES, svg=args.svg)
    except DiagramError as exc:
        print(f"stovepipe-fsm diagram: {exc}", file=sys.stderr)
        return EXIT_USAGE
    out_dir = Path(args.out)
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


if __name__ == "__main__":
    sys.exit(main())
