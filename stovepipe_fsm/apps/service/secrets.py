"""Where NATS credentials come from, and keeping them out of what is printed.

A secret given as a command-line flag is readable by every local user in the process
list, so each one can come from a file or the environment instead:

=============  =====================  ===========================
credential     file flag              environment variable
=============  =====================  ===========================
user           (not a secret)         ``STOVEPIPE_NATS_USER``
password       ``--password-file``    ``STOVEPIPE_NATS_PASSWORD``
token          ``--token-file``       ``STOVEPIPE_NATS_TOKEN``
nkey seed      ``--nkey FILE``        ``STOVEPIPE_NATS_NKEY`` (a path)
credentials    ``--creds FILE``       ``STOVEPIPE_NATS_CREDS`` (a path)
=============  =====================  ===========================

A flag wins over the environment. ``--password`` and ``--token`` still work, with a
warning; giving a secret both as a flag and as a file is a usage error. :func:`redact`
removes user info from every URL in a text, for error messages and log lines.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENV_USER = "STOVEPIPE_NATS_USER"
ENV_PASSWORD = "STOVEPIPE_NATS_PASSWORD"
ENV_TOKEN = "STOVEPIPE_NATS_TOKEN"
ENV_NKEY = "STOVEPIPE_NATS_NKEY"
ENV_CREDS = "STOVEPIPE_NATS_CREDS"
#: A secret file is a line of text; anything larger is not one.
MAX_SECRET_BYTES = 64 * 1024

_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")


def redact(text: str) -> str:
    """``text`` with the user info of every URL in it replaced by ``***``."""
    return _USERINFO.sub(r"\g<scheme>***@", text)


@dataclass(frozen=True)
class Credentials:
    user: str | None = None
    password: str | None = None
    token: str | None = None
    nkey_seed: str | None = None
    creds: str | None = None
    #: What the caller should print before connecting (never containing a secret).
    warnings: tuple[str, ...] = ()


def read_secret_file(path: str, flag: str) -> tuple[str, list[str]]:
    """The secret in ``path`` (one line; trailing newline dropped) and any warnings.

    ``ValueError`` naming ``flag`` and the file for an unreadable, empty or oversized one.
    """
    warnings: list[str] = []
    try:
        info = os.stat(path)
        if info.st_size > MAX_SECRET_BYTES:
            raise ValueError(f"{flag} {path}: {info.st_size} bytes is not a secret")
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{flag} {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        warnings.append(f"{flag} {path} is readable by other users; chmod 600 it")
    secret = text.rstrip("\r\n")
    if not secret:
        raise ValueError(f"{flag} {path} is empty")
    return secret, warnings


def _one(
    name: str,
    value: str | None,
    file_flag: str,
    path: str | None,
    env_name: str,
    environ: Mapping[str, str],
) -> tuple[str | None, list[str]]:
    if value and path:
        raise ValueError(f"--{name} and {file_flag} both give the {name}; give one")
    if path:
        return read_secret_file(path, file_flag)
    if value:
        return value, [
            f"--{name} on the command line is visible to every local user; "
            f"use {file_flag} or {env_name}"
        ]
    return environ.get(env_name) or None, []


def resolve_credentials(
    *,
    user: str | None = None,
    password: str | None = None,
    password_file: str | None = None,
    token: str | None = None,
    token_file: str | None = None,
    nkey: str | None = None,
    creds: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Credentials:
    """The credentials to connect with, from flags, files and ``environ``."""
    env = os.environ if environ is None else environ
    warnings: list[str] = []
    resolved_password, more = _one(
        "password", password, "--password-file", password_file, ENV_PASSWORD, env
    )
    warnings += more
    resolved_token, more = _one("token", token, "--token-file", token_file, ENV_TOKEN, env)
    warnings += more
    nkey_path = nkey or env.get(ENV_NKEY) or None
    if nkey_path:
        _secret, more = read_secret_file(nkey_path, "--nkey")
        warnings += more
    creds_path = creds or env.get(ENV_CREDS) or None
    if creds_path and not Path(creds_path).is_file():
        raise ValueError(f"--creds {creds_path}: no such file")
    return Credentials(
        user=user or env.get(ENV_USER) or None,
        password=resolved_password,
        token=resolved_token,
        nkey_seed=nkey_path,
        creds=creds_path,
        warnings=tuple(warnings),
    )
