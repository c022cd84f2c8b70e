"""loopwatch settings, all read from the environment (see the README's table).

No environment at all gives the embedded default: SQLite, an in-memory channel
layer and eager Celery, so a newcomer can start with one command. DATABASE_URL
and REDIS_URL switch to PostgreSQL (psycopg 3) and Redis.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from loopwatch.env import (
    database_from_url,
    env_bool,
    env_int,
    env_list,
    env_str,
    redis_url,
    secret_key_file,
)

BASE_DIR = Path(__file__).resolve().parent.parent

DEV_SECRET_KEY = "dev-insecure-loopwatch-key-change-me"
# Off unless asked for: a debug page shows a 500's locals and request to whoever caused it.
# `python3 dev.py up` (the Quickstart) turns it on.
DEBUG = env_bool("DEBUG", False)
DATABASE_URL = env_str("DATABASE_URL")

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
    "drf_spectacular_sidecar",  # Swagger UI's files, served from here (no CDN)
    "channels",
    "axes",
    "ingest",
    "dashboards",
    "demo",  # demo traffic and the demo user (manage.py simulate, demo_setup)
]

MIDDLEWARE = [
    # First: counts every answer, the 500s and 503s of the middleware below included.
    "ingest.metrics.ResponsesMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "loopwatch.security.ContentSecurityPolicyMiddleware",
    # Serves static files from the ASGI server itself: no separate web server needed.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # A view that failed on the database answers 503 with Retry-After (docs/operations.md).
    "ingest.api.errors.DatabaseUnavailableMiddleware",
    # A view's 404 is the app's page with the navigation, DEBUG or not (no debug page for a bad slug).
    "ingest.api.errors.NotFoundPageMiddleware",
    # Last, as django-axes asks: turns a locked-out sign-in into the lockout page.
    "axes.middleware.AxesMiddleware",
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
# A streaming replica of DATABASE_URL's database: the dashboards' pages read from it
# (loopwatch/db/replica.py says which reads, and how a person's own writes stay visible to them).
DATABASE_REPLICA_URL = env_str("DATABASE_REPLICA_URL")
# Seconds a browser that changed something on a page reads from the primary (read-your-writes).
LOOPWATCH_REPLICA_PIN_S = env_int("LOOPWATCH_REPLICA_PIN_S", 10, minimum=0)
if DATABASE_REPLICA_URL:
    if not DATABASE_URL or not DATABASE_URL.startswith(("postgres", "pgsql")):
        raise ImproperlyConfigured("DATABASE_REPLICA_URL: needs a PostgreSQL DATABASE_URL (the primary)")
    DATABASES["replica"] = database_from_url("DATABASE_REPLICA_URL", DATABASE_REPLICA_URL)
    # The dashboards' GETs read from it (loopwatch/db/replica.py), after authentication (the pin is
    # per browser); without a replica no request pays for resolving its view twice.
    MIDDLEWARE.insert(
        MIDDLEWARE.index("django.contrib.auth.middleware.AuthenticationMiddleware") + 1,
        "loopwatch.db.replica.ReplicaReadsMiddleware",
    )
    # Tests make no database of their own for it: it is the primary's (a copy of it).
    DATABASES["replica"]["TEST"] = {"MIRROR": "default"}
    DATABASE_ROUTERS = ["loopwatch.db.replica.ReplicaRouter"]

# Read after DATABASE_URL: without one (the embedded mode) a missing key is made, not refused.
SECRET_KEY = env_str("SECRET_KEY")
if not SECRET_KEY:
    if not DATABASE_URL:  # the embedded mode: one machine, a key of its own kept beside its database
        SECRET_KEY = secret_key_file(BASE_DIR / "var" / "secret-key")
    elif DEBUG:
        SECRET_KEY = DEV_SECRET_KEY
    else:
        raise ImproperlyConfigured("SECRET_KEY: set a secret of your own when DEBUG is off")
if not DEBUG and SECRET_KEY == DEV_SECRET_KEY:
    raise ImproperlyConfigured("SECRET_KEY: set a secret of your own when DEBUG is off")

# --- Redis: Celery broker and the Channels layer -------------------------------
REDIS_URL = env_str("REDIS_URL")
if REDIS_URL:
    redis_url("REDIS_URL", REDIS_URL)
    CELERY_BROKER_URL = REDIS_URL
    # kombu's Redis transport with a reconnect race closed (loopwatch.broker says which).
    CELERY_BROKER_TRANSPORT = "loopwatch.broker:Transport"
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
    # Eager Celery still opens a producer (on this in-memory transport) for each task it runs; a URL
    # without a host made kombu warn once per process that it assumed "localhost".
    CELERY_BROKER_URL = "memory://localhost/"
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
# When the broker connection is lost, a running task can no longer be acknowledged on it: Celery
# 5 let it run on and queued its ack on the dead channel, and a worker whose Redis came back empty
# sat with those acks pending and fetched nothing for minutes (tests/faults, "redis down, back
# empty", once in CI). Cancelling them (Celery 6's default) is safe: every task is harmless when
# delivered twice and a pass's work is one transaction per run; the runs are found again by
# detect_sweep.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
# Without a socket timeout a synchronous command on a broker that vanished without closing the
# connection (failover, a firewall's idle timeout) waits forever, in the worker's main process too.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "socket_timeout": 10,
    "socket_connect_timeout": 5,
    "health_check_interval": 10,
}
# Runs whose enqueue was lost (Redis away at commit time, a task killed after taking them) are found
# by detect_sweep: every worker sends it this often, one worker of all each time (loopwatch.celery),
# and beat too, so that losing beat delays nothing by more than this (docs/operations.md).
LOOPWATCH_SWEEP_EVERY_S = env_int("LOOPWATCH_SWEEP_EVERY_S", 30, minimum=1)
# The most a request's enqueue waits for Redis (ingest.pending); then the process adds the runs again
# when Redis answers.
LOOPWATCH_ENQUEUE_TIMEOUT_MS = env_int("LOOPWATCH_ENQUEUE_TIMEOUT_MS", 250, minimum=10)
CELERY_BEAT_SCHEDULE = {
    "detect-sweep": {"task": "ingest.detect_sweep", "schedule": float(LOOPWATCH_SWEEP_EVERY_S)},
    "ledger-expire-leases": {"task": "ingest.ledger_expire_leases", "schedule": 10.0},
    "ledger-reconcile": {"task": "ingest.ledger_reconcile", "schedule": 15.0},
    "ledger-purge": {"task": "ingest.ledger_purge", "schedule": 3600.0},
    "otlp-parked-sweep": {"task": "ingest.otlp_parked_sweep", "schedule": 60.0},
    # Partitions made ahead, the day's run id block, then what retention removes (docs/retention.md).
    "retention": {"task": "ingest.retention_apply", "schedule": 3600.0},
    "overview-rollup-purge": {"task": "dashboards.overview_rollup_purge", "schedule": 3600.0},
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
# Seconds a request's whole body may take to arrive: a client that trickles it in is cut off (408).
LOOPWATCH_BODY_TIMEOUT_S = env_int("LOOPWATCH_BODY_TIMEOUT_S", 60, minimum=1)
# Time budgets (docs/limits.md): a guard check's catching up with the run, a threshold preview's replay.
LOOPWATCH_GUARD_BUDGET_MS = env_int("LOOPWATCH_GUARD_BUDGET_MS", 2000, minimum=1)
LOOPWATCH_PREVIEW_BUDGET_MS = env_int("LOOPWATCH_PREVIEW_BUDGET_MS", 10_000, minimum=1)
# Overview renders one web process makes at once; more wait up to 10 s, then get a 503 with
# Retry-After. The page reads stored figures, bounded whatever a tenant sends, but a few heavy ranges
# at once must not starve the process's other requests (its health check among them).
LOOPWATCH_OVERVIEW_RENDERS = env_int("LOOPWATCH_OVERVIEW_RENDERS", 2, minimum=1)
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


def _reconciler_headers(value: dict) -> dict:
    """{"<tenant slug>": {"<name>": {"Header": "value"}}}: credentials belong to a tenant."""
    shape = '{"<tenant slug>": {"<name>": {"Authorization": "Bearer ..."}}}'
    for slug, names in value.items():
        if isinstance(names, dict) and names and all(isinstance(v, str) for v in names.values()):
            raise ImproperlyConfigured(
                f"LOOPWATCH_RECONCILER_HEADERS: {slug!r} holds headers, but headers now belong to a "
                f"tenant: {shape} (a reconciler of that tenant names them in headers_name)"
            )
        if not isinstance(names, dict) or not all(
            isinstance(h, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in h.items())
            for h in names.values()
        ):
            raise ImproperlyConfigured(f"LOOPWATCH_RECONCILER_HEADERS: {slug!r} must be shaped like {shape}")
    return value


# Headers for reconcilers' status checks, per tenant slug and name (docs/ledger.md).
LOOPWATCH_RECONCILER_HEADERS = _reconciler_headers(_env_json("LOOPWATCH_RECONCILER_HEADERS", {}))
# Hosts (names or addresses) a reconciler may ask although they are private, loopback or link-local.
LOOPWATCH_RECONCILER_ALLOWED_HOSTS = env_list("LOOPWATCH_RECONCILER_ALLOWED_HOSTS", [])
# Hosts (names or addresses) a notification rule's webhook may reach although they are private,
# loopback or link-local (docs/operators.md).
LOOPWATCH_NOTIFY_ALLOW_HOSTS = env_list("LOOPWATCH_NOTIFY_ALLOW_HOSTS", [])
# The address of this installation, for the links notifications carry ("" : relative links).
LOOPWATCH_PUBLIC_URL = env_str("LOOPWATCH_PUBLIC_URL").rstrip("/")
# Notification e-mail goes through Django's mail backend: SMTP when EMAIL_HOST is set, else the console.
EMAIL_HOST = env_str("EMAIL_HOST")
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "loopwatch@localhost")
EMAIL_BACKEND = env_str(
    "EMAIL_BACKEND",
    "django.core.mail.backends.smtp.EmailBackend"
    if EMAIL_HOST
    else "django.core.mail.backends.console.EmailBackend",
)
# Days to keep finished operations, per tool, "default" for the rest.
LOOPWATCH_LEDGER_TTL_DAYS = _env_json("LOOPWATCH_LEDGER_TTL_DAYS", {"default": 30})
if not all(isinstance(v, int | float) and v > 0 for v in LOOPWATCH_LEDGER_TTL_DAYS.values()):
    raise ImproperlyConfigured("LOOPWATCH_LEDGER_TTL_DAYS: every value must be a positive number of days")
LOOPWATCH_LEDGER_TTL_DAYS.setdefault("default", 30)

# --- retention (docs/retention.md) -------------------------------------------------
# Days a run's events, model rounds and tool calls are kept after it ended (or went silent), for the
# tenants without a retention of their own (Tenant.retention_days).
LOOPWATCH_RETENTION_DAYS = env_int("LOOPWATCH_RETENTION_DAYS", 30, minimum=1)
# Runs themselves (their figures, cursor and detections) stay longer; a tenant whose events are kept
# longer keeps its runs at least as long.
LOOPWATCH_RUN_RETENTION_DAYS = env_int("LOOPWATCH_RUN_RETENTION_DAYS", 400, minimum=1)
# The overview's hourly rollups stay longer still: the charts of past years outlive their runs.
LOOPWATCH_ROLLUP_RETENTION_DAYS = env_int("LOOPWATCH_ROLLUP_RETENTION_DAYS", 800, minimum=1)
LOOPWATCH_METRICS_TOKEN = env_str("LOOPWATCH_METRICS_TOKEN")
# Without a token, /metrics answers only in the embedded mode with DEBUG on (the Quickstart), or when
# said explicitly (a scraper on a network that keeps others out).
LOOPWATCH_METRICS_PUBLIC = env_bool("LOOPWATCH_METRICS_PUBLIC", DEBUG and not DATABASE_URL)
# Distinct tool names a process labels its metrics with; the rest are counted as "other".
LOOPWATCH_METRICS_MAX_TOOLS = env_int("LOOPWATCH_METRICS_MAX_TOOLS", 50, minimum=1)
# Tenants (slugs) whose metrics carry their slug as the `tenant` label; the others are "other".
LOOPWATCH_METRICS_TENANTS = frozenset(env_list("LOOPWATCH_METRICS_TENANTS", []))
# Rate limits and quotas of a tenant that sets none of its own (ingest.quotas, docs/limits.md); 0: none.
LOOPWATCH_TENANT_EVENTS_PER_S = env_int("LOOPWATCH_TENANT_EVENTS_PER_S", 0, minimum=0)
LOOPWATCH_TENANT_EVENTS_PER_DAY = env_int("LOOPWATCH_TENANT_EVENTS_PER_DAY", 0, minimum=0)
LOOPWATCH_TENANT_CHECKS_PER_S = env_int("LOOPWATCH_TENANT_CHECKS_PER_S", 0, minimum=0)
# Seconds' worth of a rate a tenant or key may send at once after a quiet while (the bucket's size).
LOOPWATCH_RATE_BURST_S = env_int("LOOPWATCH_RATE_BURST_S", 2, minimum=1)
# Live alerts sockets one user may hold open at once (each joins groups and polls); more → 4429.
LOOPWATCH_ALERT_SOCKETS_PER_USER = env_int("LOOPWATCH_ALERT_SOCKETS_PER_USER", 10, minimum=1)
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
    # /api/v1/docs: Swagger UI from drf-spectacular-sidecar's static files, its init script a file
    # of its own (script-src 'self'), and no validator (it would send the schema to another site).
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "/favicon.ico",
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "persistAuthorization": False, "validatorUrl": None},
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

# --- sign-in and transport security (docs/security.md) -------------------------------------------
# django-axes: after LOOPWATCH_LOGIN_FAILURE_LIMIT wrong passwords for one user from one address,
# that pair is locked out (429, the right password included) for LOOPWATCH_LOGIN_LOCKOUT_MIN.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses a locked-out pair before any password check
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("LOOPWATCH_LOGIN_FAILURE_LIMIT", 10, minimum=1)
AXES_HTTP_RESPONSE_CODE = 429  # axes' own default, said here: loopwatch.security answers with it
AXES_COOLOFF_TIME = timedelta(minutes=env_int("LOOPWATCH_LOGIN_LOCKOUT_MIN", 15, minimum=1))
# The user and the address together: neither locks a user out from everywhere (anyone could) nor
# everyone behind one address.
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_DISABLE_ACCESS_LOG = True  # failures are kept, not a row per successful sign-in
AXES_LOCKOUT_CALLABLE = "loopwatch.security.login_locked_out"
AXES_VERBOSE = False


def _proxy_ssl_header(raw: str) -> tuple[str, str] | None:
    """SECURE_PROXY_SSL_HEADER=X-Forwarded-Proto (meaning https) or Name=value."""
    if not raw.strip():
        return None
    name, _, value = raw.partition("=")
    name, value = name.strip(), (value.strip() or "https")
    if not name or not all(c.isalnum() or c == "-" for c in name):
        raise ImproperlyConfigured(
            f"SECURE_PROXY_SSL_HEADER={raw!r}: expected a header name, e.g. X-Forwarded-Proto"
        )
    return "HTTP_" + name.upper().replace("-", "_"), value


# Only set it behind a proxy that ends TLS and always sets (or strips) this header itself.
SECURE_PROXY_SSL_HEADER = _proxy_ssl_header(env_str("SECURE_PROXY_SSL_HEADER"))
# With DEBUG off, cookies travel over HTTPS only and browsers are told to keep to HTTPS (HSTS is
# sent on HTTPS answers only).
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 365 * 24 * 3600)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
# Off by default: a proxy in front usually redirects to HTTPS itself.
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
# The pages run scripts from this origin only (data goes through json_script); Plotly styles its
# charts inline; the alerts socket is this origin's (CSP 3 'self' covers ws:/wss:). Empty: no header.
LOOPWATCH_CSP = env_str(
    "LOOPWATCH_CSP",
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
    "font-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; "
    "frame-ancestors 'none'",
)

# A 500's report (the debug page, a logged or mailed report) hides connection URLs and secrets.
DEFAULT_EXCEPTION_REPORTER_FILTER = "loopwatch.security.SafeExceptionReporterFilter"

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
