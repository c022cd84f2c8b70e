"""loopwatch settings, all read from the environment (see the README's table).

No environment at all gives the embedded default: SQLite, an in-memory channel
layer and eager Celery, so a newcomer can start with one command. DATABASE_URL
and REDIS_URL switch to PostgreSQL (psycopg 3) and Redis.
"""

from __future__ import annotations

import sys
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from loopwatch.env import database_from_url, env_bool, env_int, env_list, env_str, redis_url

BASE_DIR = Path(__file__).resolve().parent.parent

DEV_SECRET_KEY = "dev-insecure-loopwatch-key-change-me"
DEBUG = env_bool("DEBUG", True)
SECRET_KEY = env_str("SECRET_KEY", DEV_SECRET_KEY)
if not DEBUG and SECRET_KEY == DEV_SECRET_KEY:
    raise ImproperlyConfigured("SECRET_KEY: set a secret of your own when DEBUG is off")
if not SECRET_KEY:
    raise ImproperlyConfigured("SECRET_KEY: must not be empty")

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "channels",
    "ingest",
    "dashboards",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Serves static files from the ASGI server itself: no separate web server needed.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "loopwatch.urls"
ASGI_APPLICATION = "loopwatch.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "dashboards.context_processors.nav",
            ],
        },
    },
]

# --- database ---------------------------------------------------------------
DATABASE_URL = env_str("DATABASE_URL")
if DATABASE_URL:
    DATABASES = {"default": database_from_url("DATABASE_URL", DATABASE_URL)}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": BASE_DIR / "var" / "loopwatch.sqlite3",
            # WAL lets readers go on while one writes; IMMEDIATE takes the write lock at BEGIN, so two
            # concurrent batches for one run are serialised (SQLite has no SELECT ... FOR UPDATE).
            "OPTIONS": {
                "init_command": "PRAGMA journal_mode=WAL;",
                "timeout": 20,
                "transaction_mode": "IMMEDIATE",
            },
        }
    }
    (BASE_DIR / "var").mkdir(exist_ok=True)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis: Celery broker and the Channels layer -------------------------------
REDIS_URL = env_str("REDIS_URL")
if REDIS_URL:
    redis_url("REDIS_URL", REDIS_URL)
    CELERY_BROKER_URL = REDIS_URL
    CELERY_TASK_ALWAYS_EAGER = False
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # A consumer waits for messages with a blocking BZPOPMIN of 5 s: the socket's read timeout
            # must be longer (redis-py 8 defaults it to 5 s), or every idle WebSocket is torn down.
            "CONFIG": {
                "hosts": [{"address": REDIS_URL, "socket_timeout": 30}],
                "capacity": 1000,
                "expiry": 30,
            },
        }
    }
else:
    CELERY_BROKER_URL = "memory://"
    # Eager: tasks run in the web process right after the commit that queued them.
    CELERY_TASK_ALWAYS_EAGER = True
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
# A task is acknowledged after it ran, and re-queued when its worker dies mid-way;
# every task is written to be harmless when delivered twice.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = env_str("CELERY_QUEUE", "loopwatch")
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE = {
    "detect-sweep": {"task": "ingest.detect_sweep", "schedule": 60.0},
    "ledger-expire-leases": {"task": "ingest.ledger_expire_leases", "schedule": 10.0},
    "ledger-reconcile": {"task": "ingest.ledger_reconcile", "schedule": 15.0},
    "ledger-purge": {"task": "ingest.ledger_purge", "schedule": 3600.0},
    "otlp-parked-sweep": {"task": "ingest.otlp_parked_sweep", "schedule": 60.0},
    # The overview's hourly rollup: closed hours, and hours whose runs or detections changed since.
    "overview-rollup": {
        "task": "dashboards.overview_rollup",
        "schedule": float(env_int("LOOPWATCH_ROLLUP_EVERY_S", 60, minimum=5)),
    },
}

# --- ingest limits (the README's table gives the reasons) ------------------------
LOOPWATCH_MAX_BATCH_EVENTS = env_int("LOOPWATCH_MAX_BATCH_EVENTS", 10_000, minimum=1)
LOOPWATCH_MAX_BODY_BYTES = env_int("LOOPWATCH_MAX_BODY_BYTES", 16 * 1024 * 1024, minimum=1024)
LOOPWATCH_MAX_EVENT_BYTES = env_int("LOOPWATCH_MAX_EVENT_BYTES", 256 * 1024, minimum=1024)
if LOOPWATCH_MAX_EVENT_BYTES > LOOPWATCH_MAX_BODY_BYTES:
    raise ImproperlyConfigured("LOOPWATCH_MAX_EVENT_BYTES: must not exceed LOOPWATCH_MAX_BODY_BYTES")
# Django's own guard sits just above ours so that ours answers first, with a 413.
DATA_UPLOAD_MAX_MEMORY_SIZE = LOOPWATCH_MAX_BODY_BYTES + 1


# --- the ledger ------------------------------------------------------------------
def _env_json(name: str, default):
    import json

    raw = env_str(name)
    if not raw:
        return default
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}: not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ImproperlyConfigured(f"{name}: must be a JSON object")
    return value


# Headers for reconcilers' status checks, by name: {"payments": {"Authorization": "Bearer ..."}}
LOOPWATCH_RECONCILER_HEADERS = _env_json("LOOPWATCH_RECONCILER_HEADERS", {})
# Days to keep finished operations, per tool, "default" for the rest.
LOOPWATCH_LEDGER_TTL_DAYS = _env_json("LOOPWATCH_LEDGER_TTL_DAYS", {"default": 30})
if not all(isinstance(v, int | float) and v > 0 for v in LOOPWATCH_LEDGER_TTL_DAYS.values()):
    raise ImproperlyConfigured("LOOPWATCH_LEDGER_TTL_DAYS: every value must be a positive number of days")
LOOPWATCH_LEDGER_TTL_DAYS.setdefault("default", 30)
LOOPWATCH_METRICS_TOKEN = env_str("LOOPWATCH_METRICS_TOKEN")
# Seconds an API key stays cached in a server process: revoking takes effect in the revoking
# process at once, in the others within this time. 0: look the key up on every request.
LOOPWATCH_KEY_CACHE_S = env_int("LOOPWATCH_KEY_CACHE_S", 5, minimum=0)


# --- OTLP ingest: which span attribute names the run (docs/otlp.md) -----------------------------
def _otlp_run_id(raw: str) -> tuple[str, ...]:
    from ingest.otlp.mapping import run_id_sources  # pure Python: no model is imported

    try:
        return run_id_sources(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"LOOPWATCH_OTLP_RUN_ID={raw!r}: {exc}") from None


LOOPWATCH_OTLP_RUN_ID = _otlp_run_id(env_str("LOOPWATCH_OTLP_RUN_ID", "trace_id"))
# Seconds a root or agent span waits for its run (its trace's model and tool spans) before it is
# dropped: exporters retry for a few minutes at most; most such spans are roots of traces without
# agent semantics, which never get a run.
LOOPWATCH_OTLP_PARK_S = env_int("LOOPWATCH_OTLP_PARK_S", 3600, minimum=60)

# --- DRF and the OpenAPI schema ---------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["ingest.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "ingest.api.errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "loopwatch API",
    "DESCRIPTION": "Trace ingestion (trace events v1) and run queries for loopwatch.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # JSON Schema's if/then (the trace event schema) needs OpenAPI 3.1.
    "OAS_VERSION": "3.1.0",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "ingest.openapi.add_trace_event_schema",
    ],
}

# --- the rest ------------------------------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(BASE_DIR / "var" / "static")))
WHITENOISE_USE_FINDERS = True  # serve from the apps' static folders too: collectstatic is optional
try:
    STATIC_ROOT.mkdir(parents=True, exist_ok=True)
except OSError:
    pass  # a read-only deployment runs collectstatic into a writable STATIC_ROOT itself
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LOG_LEVEL = env_str("LOG_LEVEL", "INFO").upper()
if LOG_LEVEL not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
    raise ImproperlyConfigured(f"LOG_LEVEL={LOG_LEVEL!r}: expected DEBUG, INFO, WARNING, ERROR or CRITICAL")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler", "stream": sys.stderr}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # Eager mode would log every task of every request; a worker keeps its own log level.
        "celery.app.trace": {"level": "WARNING" if CELERY_TASK_ALWAYS_EAGER else LOG_LEVEL},
    },
}
