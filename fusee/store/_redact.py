"""A store's target as every surface shows it: never with its password.

The one place that hides a Postgres URL's password (in its user part or a
``password=`` parameter): store reprs and errors, the CLI's messages, the
UI's header and ``GET /api/info`` all show a target through `shown_target`.
The rule: nothing shows a target that has not been through here.
"""

from __future__ import annotations

import builtins
import contextlib
from urllib.parse import parse_qsl, unquote, urlsplit

__all__ = ["redact_dsn", "secrets_of", "shown_target"]


def shown_target(target: str) -> str:
    """``target`` (a directory, ``"memory"``, a URL) as it may be shown: no password.

    Example:
        >>> shown_target("postgresql://app:s3cret@db/fusee"), shown_target("./data")
        ('postgresql://app:***@db/fusee', './data')
    """
    return redact_dsn(target) if "://" in target else target


def redact_dsn(dsn: str) -> str:
    """``dsn`` with its password (in the URL or a ``password=`` parameter) as ``***``.

    Example:
        >>> redact_dsn("postgresql://db/fusee?user=app&password=s3cret")
        'postgresql://db/fusee?user=app&password=***'
    """
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return "<an unparsable DSN>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hosts = netloc.rpartition("@")
        if ":" in userinfo:
            user = userinfo.split(":", 1)[0]
            netloc = f"{user}:***@{hosts}"
    query = parts.query
    if "password" in query.lower():
        query = "&".join(
            "password=***" if pair.split("=", 1)[0].lower() == "password" else pair
            for pair in query.split("&")
        )
    return parts._replace(netloc=netloc, query=query).geturl()


def secrets_of(dsn: str) -> tuple[str, ...]:
    """The password as it may appear in a message: as written and decoded.

    Example:
        >>> secrets_of("postgresql://app:p%40ss@db/fusee")
        ('p%40ss', 'p@ss')
    """
    found: builtins.list[str] = []
    with contextlib.suppress(ValueError):
        parts = urlsplit(dsn)
        userinfo = parts.netloc.rpartition("@")[0]
        if ":" in userinfo:
            found.append(userinfo.split(":", 1)[1])
        found += [v for k, v in parse_qsl(parts.query) if k.lower() == "password"]
    found += [unquote(s) for s in found]
    # Longest first, so a password containing another is replaced whole.
    return tuple(sorted({s for s in found if s}, key=len, reverse=True))
