"""Running git: one argv, no shell, a timeout, a stable environment.

Every git call of the adapter goes through a :data:`GitRunner`, so tests can count or
replace subprocess launches without patching asyncio. The default runner turns "could
not run git at all" into errors that say nothing about the commits asked about: a
failed start (binary missing, no file descriptor or memory left) is an
``EnvironmentFailure``, held without counting against the head; a timeout is
``Retryable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from ...domain.errors import EnvironmentFailure, Retryable

# Variables that would make git look at another repository than the one passed with
# ``-C`` (a hook or a test harness running inside some other repository sets them).
_REPOSITORY_VARIABLES = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_NAMESPACE",
    "GIT_CEILING_DIRECTORIES",
)


@dataclass(frozen=True)
class GitResult:
    """Exit status and decoded output of one git invocation."""

    returncode: int
    stdout: str
    stderr: str


GitRunner = Callable[[Sequence[str], float], Awaitable[GitResult]]
"""``await runner(argv, timeout_s)``: run ``argv`` (argv[0] is the git binary)."""


def git_environment(repo_path: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a git call about ``repo_path``.

    Messages are forced to English because errors are classified by their text; the
    ceiling stops repository discovery at ``repo_path`` so a plain directory inside
    some other repository is reported as "not a git repository" instead of silently
    answering from the enclosing one; prompts are disabled so nothing ever blocks.
    """
    env = {k: v for k, v in (os.environ if base is None else base).items()}
    for name in _REPOSITORY_VARIABLES:
        env.pop(name, None)
    env["LC_ALL"] = "C"
    env["LANGUAGE"] = "C"
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["GIT_CEILING_DIRECTORIES"] = os.path.dirname(os.path.abspath(repo_path))
    return env


def subprocess_runner(env: Mapping[str, str] | None = None) -> GitRunner:
    """A runner that launches git with asyncio subprocesses and environment ``env``."""

    async def run(argv: Sequence[str], timeout_s: float) -> GitResult:
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=None if env is None else dict(env),
            )
        except FileNotFoundError as exc:
            raise EnvironmentFailure(f"git executable {argv[0]!r} not found: {exc}") from exc
        except OSError as exc:
            raise EnvironmentFailure(f"cannot run {argv[0]!r}: {exc}") from exc
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            raise Retryable(f"git timed out after {timeout_s}s: {' '.join(argv[1:])}") from None
        except asyncio.CancelledError:
            # Never leave an orphan git behind a cancelled delivery.
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await asyncio.shield(process.wait())
            raise
        return GitResult(
            returncode=process.returncode if process.returncode is not None else -1,
            stdout=stdout.decode("utf-8", "replace"),
            stderr=stderr.decode("utf-8", "replace").strip(),
        )

    return run


def spawn_failures_classified(runner: GitRunner) -> GitRunner:
    """``runner``, with an ``OSError`` it raises (git could not be started: no file
    descriptor, no memory) turned into an ``EnvironmentFailure``, as the default runner
    does: a replaced launcher obeys the same error contract."""

    async def run(argv: Sequence[str], timeout_s: float) -> GitResult:
        try:
            return await runner(argv, timeout_s)
        except OSError as exc:
            raise EnvironmentFailure(f"cannot run {argv[0]!r}: {exc}") from exc

    return run
