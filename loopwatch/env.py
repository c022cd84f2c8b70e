"""Typed readers for settings from the environment.

Each raises ImproperlyConfigured naming the variable, so a bad value stops the
process at start-up instead of surfacing later as a confusing runtime error.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str = "", *, environ: Mapping[str, str] = os.environ) -> str:
    return environ.get(name, default)


def env_bool(name: str, default: bool, *, environ: Mapping[str, str] = os.environ) -> bool:
    raw = environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r}: expected one of 1/0, true/false, yes/no, on/off")


def env_int(name: str, default: int, *, minimum: int = 0, environ: Mapping[str, str] = os.environ) -> int:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r}: expected an integer") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name}={raw!r}: must be at least {minimum}")
    return value


def env_list(name: str, default: list[str], *, environ: Mapping[str, str] = os.environ) -> list[str]:
    raw = environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def database_from_url(name: str, url: str) -> dict:
    """A Django DATABASES entry from postgres://user:pass@host:port/db?opt=v or sqlite:///path."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}: not a valid URL ({exc})") from None
    if parts.scheme in ("postgres", "postgresql", "pgsql"):
        db_name = unquote(parts.path.lstrip("/"))
        if not db_name:
            raise ImproperlyConfigured(f"{name}={url!r}: the URL names no database (postgres://host/DBNAME)")
        options: dict = dict(parse_qsl(parts.query))
        conn_max_age = options.pop("conn_max_age", "60")
        if not conn_max_age.isdigit():
            raise ImproperlyConfigured(f"{name}: conn_max_age must be a number of seconds")
        # Under ASGI every request runs in a thread of its own, so persistent connections are never
        # reused: a pool (psycopg_pool) is what saves a new backend per request. pool=false turns it
        # off (behind PgBouncer, say) and falls back to conn_max_age.
        pool = options.pop("pool", "true").lower()
        sizes = {
            key: options.pop(f"pool_{key}", default)
            for key, default in (("min_size", "1"), ("max_size", "8"))
        }
        if pool not in ("true", "false") or not all(v.isdigit() and int(v) > 0 for v in sizes.values()):
            raise ImproperlyConfigured(
                f"{name}: pool must be true or false, pool_min_size/pool_max_size positive"
            )
        # Outages (docs/operations.md): a request waits pool_timeout for a connection (then 503); a
        # new connection waits connect_timeout for the server (libpq's option, given to psycopg); a
        # query with no byte from the server for stall_timeout asks whether the server is still
        # there, and gives up if not (loopwatch.db.stall; 0: never).
        pool_timeout = _seconds(name, "pool_timeout", options.pop("pool_timeout", "3"), minimum=0.1)
        stall_timeout = _seconds(name, "stall_timeout", options.pop("stall_timeout", "2"), minimum=0)
        connect_timeout = options.setdefault("connect_timeout", "3")
        if not connect_timeout.isdigit() or int(connect_timeout) < 2:
            raise ImproperlyConfigured(
                f"{name}: connect_timeout must be a whole number of seconds, at least 2"
            )
        if pool == "true":
            options["pool"] = {key: int(v) for key, v in sizes.items()} | {
                "timeout": pool_timeout,
                "stall_s": stall_timeout,
            }
            conn_max_age = "0"
        return {
            "ENGINE": "loopwatch.db",
            "NAME": db_name,
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(port or ""),
            "CONN_MAX_AGE": int(conn_max_age),
            "CONN_HEALTH_CHECKS": True,
            "OPTIONS": options,
            "TEST": {"NAME": f"test_{db_name}"},
        }
    if parts.scheme == "sqlite":
        # sqlite:///relative.db and sqlite:////absolute.db, as SQLAlchemy spells them
        path = unquote(parts.path)[1:]
        if not path:
            raise ImproperlyConfigured(f"{name}={url!r}: sqlite URL needs a path (sqlite:///db.sqlite3)")
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": path}
    raise ImproperlyConfigured(
        f"{name}={url!r}: unsupported scheme {parts.scheme!r} (use postgres://... or sqlite:///...)"
    )


def _seconds(name: str, option: str, raw: str, *, minimum: float) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value >= minimum or value == float("inf"):
        raise ImproperlyConfigured(f"{name}: {option} must be a number of seconds, at least {minimum:g}")
    return value


def redis_url(name: str, url: str) -> str:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - validates the port
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}: not a valid URL ({exc})") from None
    if parts.scheme == "unix":
        # redis-py and the channel layer would take it; Celery's Redis broker has no such scheme
        # (kombu: "No such transport: unix"), and the workers could not start.
        raise ImproperlyConfigured(
            f"{name}={url!r}: a unix socket is not supported (Celery's broker takes redis:// or rediss://); "
            "expected redis://host:port/db"
        )
    if parts.scheme not in ("redis", "rediss") or not (parts.hostname or parts.path):
        raise ImproperlyConfigured(f"{name}={url!r}: expected redis://host:port/db")
    return url


def secret_key_file(path: Path) -> str:
    """The secret kept in `path`, made (random, readable by its owner only) when there is none.

    Every process of one embedded installation reads the same file, so their sessions and signed
    values agree; two processes starting at once make it once (O_EXCL), the other reads it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        for _ in range(50):  # the other process may be writing it this very moment
            if key := path.read_text().strip():
                return key
            time.sleep(0.02)
        raise ImproperlyConfigured(f"SECRET_KEY: {path} is empty; delete it or set SECRET_KEY") from None
    key = secrets.token_urlsafe(50)
    with os.fdopen(fd, "w") as out:
        out.write(key + "\n")
    return key
