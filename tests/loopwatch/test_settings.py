"""Settings come from the environment; bad values stop start-up with a message naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from loopwatch.env import database_from_url, env_bool, env_int, redis_url
from tests.settings import TEST_ENVIRONMENT

ROOT = Path(__file__).resolve().parents[2]


def _start(**env: str) -> subprocess.CompletedProcess:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL", "DEBUG", *TEST_ENVIRONMENT)
    }
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings; "
            "print(settings.DATABASES['default']['ENGINE'], settings.CELERY_TASK_ALWAYS_EAGER, "
            "settings.CHANNEL_LAYERS['default']['BACKEND'])",
        ],
        cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": "loopwatch.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_no_environment_is_the_embedded_default():
    done = _start()
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "django.db.backends.sqlite3",
        "True",
        "channels.layers.InMemoryChannelLayer",
    ]


def test_database_and_redis_urls_switch_to_the_real_servers():
    done = _start(
        DATABASE_URL="postgres://u:p@db.example:5433/lw",
        REDIS_URL="redis://cache:6379/2",
        SECRET_KEY="s3cret-for-the-test",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "loopwatch.db",
        "False",
        "channels_redis.core.RedisChannelLayer",
    ]


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"DATABASE_URL": "postgres://db.example/lw"}, "SECRET_KEY"),
        ({"DEBUG": "false", "DATABASE_URL": "postgres://db.example/lw"}, "SECRET_KEY"),
        ({"DEBUG": "maybe"}, "DEBUG"),
        ({"DATABASE_URL": "mysql://x/y"}, "DATABASE_URL"),
        ({"DATABASE_URL": "postgres://host:notaport/db"}, "DATABASE_URL"),
        ({"DATABASE_URL": "postgres://host/"}, "DATABASE_URL"),
        ({"DATABASE_URL": "postgres://host/db?pool=maybe"}, "DATABASE_URL"),
        ({"REDIS_URL": "http://cache"}, "REDIS_URL"),
        ({"REDIS_URL": "unix:///run/redis/redis.sock?db=2"}, "unix socket"),
        ({"LOOPWATCH_MAX_BATCH_EVENTS": "lots"}, "LOOPWATCH_MAX_BATCH_EVENTS"),
        ({"LOOPWATCH_MAX_BATCH_EVENTS": "0"}, "LOOPWATCH_MAX_BATCH_EVENTS"),
        ({"LOOPWATCH_KEY_CACHE_S": "-1"}, "LOOPWATCH_KEY_CACHE_S"),
        ({"LOOPWATCH_SWEEP_EVERY_S": "0"}, "LOOPWATCH_SWEEP_EVERY_S"),
        ({"LOOPWATCH_ENQUEUE_TIMEOUT_MS": "soon"}, "LOOPWATCH_ENQUEUE_TIMEOUT_MS"),
        ({"LOG_LEVEL": "LOUD"}, "LOG_LEVEL"),
        # Headers belong to a tenant now: the old flat shape is refused, saying the new one.
        ({"LOOPWATCH_RECONCILER_HEADERS": '{"payments": {"Authorization": "x"}}'}, "<tenant slug>"),
        ({"LOOPWATCH_RECONCILER_HEADERS": '{"acme": ["x"]}'}, "LOOPWATCH_RECONCILER_HEADERS"),
    ],
)
def test_a_bad_value_stops_start_up_naming_the_variable(env, named):
    done = _start(**env)
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr and named in done.stderr.splitlines()[-1]


def test_debug_off_with_a_secret_of_ones_own_starts():
    assert _start(DEBUG="false", SECRET_KEY="s3cret-for-the-test").returncode == 0


def _setting(expression: str, **env: str) -> str:
    """repr() of an expression on the settings of a process started with this environment."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL", "DEBUG", *TEST_ENVIRONMENT)
    }
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import django; django.setup(); from django.conf import settings; print(repr({expression}))",
        ],
        cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": "loopwatch.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_debug_is_off_unless_asked_for():
    assert _setting("settings.DEBUG") == "False"
    assert _setting("settings.DEBUG", DATABASE_URL="postgres://db.example/lw", SECRET_KEY="x" * 50) == "False"
    assert _setting("settings.DEBUG", DEBUG="true") == "True"


def test_the_embedded_mode_without_a_secret_makes_one_of_its_own_and_keeps_it():
    from loopwatch.settings import DEV_SECRET_KEY

    first = _setting("settings.SECRET_KEY")
    assert first != repr(DEV_SECRET_KEY) and len(first) > 50
    assert _setting("settings.SECRET_KEY") == first  # sessions survive a restart
    assert (ROOT / "var" / "secret-key").stat().st_mode & 0o077 == 0  # readable by its owner only
    assert _setting("settings.SECRET_KEY", SECRET_KEY="mine-" + "x" * 50) == repr("mine-" + "x" * 50)


def test_reconciler_headers_per_tenant_start():
    done = _start(LOOPWATCH_RECONCILER_HEADERS='{"acme": {"payments": {"Authorization": "Bearer x"}}}')
    assert done.returncode == 0, done.stderr


def test_env_helpers():
    assert env_bool("X", False, environ={"X": "Yes"}) is True
    assert env_int("X", 5, environ={}) == 5
    with pytest.raises(ImproperlyConfigured, match="X"):
        env_int("X", 5, minimum=10, environ={"X": "3"})
    db = database_from_url("DATABASE_URL", "postgresql://us%40er:p%2Fw@h:6432/name?sslmode=require")
    assert (db["USER"], db["PASSWORD"], db["HOST"], db["PORT"], db["NAME"]) == (
        "us@er",
        "p/w",
        "h",
        "6432",
        "name",
    )
    assert db["OPTIONS"] == {
        "sslmode": "require",
        "connect_timeout": "3",
        "pool": {"min_size": 1, "max_size": 8, "timeout": 3.0, "stall_s": 2.0},
    }
    assert db["CONN_MAX_AGE"] == 0
    unpooled = database_from_url("DATABASE_URL", "postgres://h/n?pool=false&conn_max_age=30")
    assert "pool" not in unpooled["OPTIONS"] and unpooled["CONN_MAX_AGE"] == 30
    assert database_from_url("D", "sqlite:////tmp/x.db")["NAME"] == "/tmp/x.db"
    assert redis_url("R", "redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_database_url_outage_options():
    """pool_timeout, stall_timeout and connect_timeout (docs/operations.md), checked at start-up."""
    db = database_from_url(
        "DATABASE_URL", "postgres://h/n?pool_timeout=1.5&stall_timeout=0&connect_timeout=5"
    )
    assert db["OPTIONS"] == {
        "connect_timeout": "5",
        "pool": {"min_size": 1, "max_size": 8, "timeout": 1.5, "stall_s": 0.0},
    }
    for bad, option in [
        ("pool_timeout=0", "pool_timeout"),
        ("pool_timeout=soon", "pool_timeout"),
        ("stall_timeout=-1", "stall_timeout"),
        ("stall_timeout=inf", "stall_timeout"),
        ("connect_timeout=1", "connect_timeout"),
        ("connect_timeout=2.5", "connect_timeout"),
    ]:
        with pytest.raises(ImproperlyConfigured, match=f"DATABASE_URL: {option}"):
            database_from_url("DATABASE_URL", f"postgres://h/n?{bad}")


def test_the_workers_sweep_at_least_every_minute_by_default():
    # Losing beat delays a lost run by at most this (plus a pass): the bound is a minute.
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWATCH_")}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings as s; "
            "print(s.LOOPWATCH_SWEEP_EVERY_S, s.CELERY_BEAT_SCHEDULE['detect-sweep']['schedule'])",
        ],
        cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": "loopwatch.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    every, beat = map(float, done.stdout.split())
    assert every <= 60 and beat == every
