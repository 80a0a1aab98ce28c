"""OpenRelay settings: embedded defaults, production by environment.

No variable set: SQLite under OPENRELAY_DATA_DIR, the django-q2 ORM broker
and the in-memory channel layer. DATABASE_URL and REDIS_URL switch to
PostgreSQL and Redis. Every variable is listed in docs/reference/settings.md (tests/docs_tests checks it).
"""

import logging
import os
import sys
from pathlib import Path

import dj_database_url

from files.storage import storage_from_url
from openrelay.lib.env import (
    DEV_SECRET_KEY,
    ImproperlyConfiguredEnv,
    envbool,
    envfloat,
    envint,
    envlist,
    envrate,
    envstr,
    envwindows,
)

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(envstr("OPENRELAY_DATA_DIR", str(BASE_DIR / "var"))).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = envstr("SECRET_KEY", DEV_SECRET_KEY)
# `manage.py up` warns once and marks its children, so the console says it once, not once a process.
if SECRET_KEY == DEV_SECRET_KEY and not envbool("OPENRELAY_DEV_KEY_NOTED", False):
    logging.getLogger("openrelay").warning(
        "SECRET_KEY is not set: using the development default. Set SECRET_KEY in production."
    )
DEBUG = envbool("DEBUG", False)
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["*"])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    # Before django_q: its `qcluster` command is ours (batches/management/commands/qcluster.py).
    "batches",
    "django_q",
    "channels",
    "openrelay.core",
    "webhooks",
    "files",
    "billing",
]

MIDDLEWARE = [
    # /healthz and /readyz, before anything that checks the Host or opens a session.
    "openrelay.web.probes.ProbeMiddleware",
    "openrelay.web.middleware.RequestIdMiddleware",
    # Outside everything that answers an error, so each reaches Anthropic's routes in Anthropic's envelope.
    "openrelay.web.middleware.DialectErrorMiddleware",
    "openrelay.web.middleware.HostRoutingMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files (the dashboard's CSS and JS) under any ASGI server, no web server in front needed.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "openrelay.web.middleware.ApiErrorMiddleware",
]

ROOT_URLCONF = "openrelay.urls"
APPEND_SLASH = False

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
            ],
        },
    },
]

ASGI_APPLICATION = "openrelay.asgi.application"

DATABASE_URL = envstr("DATABASE_URL", f"sqlite:///{DATA_DIR / 'openrelay.sqlite3'}")
# The web process (ASGI) opens a connection per request, as Django requires
# there. The worker cluster's long-lived processes keep theirs: its broker
# polls every Q_CLUSTER["poll"] seconds, and a new connection a poll cost
# ~4% of a core at idle.
WORKER_PROCESS = sys.argv[1:2] == ["qcluster"]
DATABASES = {
    "default": dj_database_url.parse(
        DATABASE_URL, conn_max_age=600 if WORKER_PROCESS else 0, conn_health_checks=WORKER_PROCESS
    )
}
# Every PostgreSQL connection the product opens has a clock (issue 54): without one a query
# to a server that vanished (a network cut, a host lost) never raised, and the OS's 2 h
# keepalive was the only bound. libpq's own parameters, the client's side; options in
# DATABASE_URL's query string win. The engine's sessions add the server's side
# (batches.engine.dbretry.deadlines).
OPENRELAY_DB_CONNECT_TIMEOUT_S = envint("OPENRELAY_DB_CONNECT_TIMEOUT_S", 5, minimum=2)
OPENRELAY_DB_KEEPALIVE_IDLE_S = envint("OPENRELAY_DB_KEEPALIVE_IDLE_S", 5, minimum=1)
OPENRELAY_DB_KEEPALIVE_INTERVAL_S = envint("OPENRELAY_DB_KEEPALIVE_INTERVAL_S", 2, minimum=1)
OPENRELAY_DB_KEEPALIVE_COUNT = envint("OPENRELAY_DB_KEEPALIVE_COUNT", 3, minimum=1)
OPENRELAY_DB_TCP_USER_TIMEOUT_S = envint("OPENRELAY_DB_TCP_USER_TIMEOUT_S", 15, minimum=1)
# The engine's sessions, on the server: a transaction left open by a host that vanished ends
# (and frees its row locks) after this long, and a statement waits this long for a lock at most.
OPENRELAY_DB_IDLE_IN_TRANSACTION_S = envfloat("OPENRELAY_DB_IDLE_IN_TRANSACTION_S", 10.0, minimum=0.1)
OPENRELAY_DB_LOCK_TIMEOUT_S = envfloat("OPENRELAY_DB_LOCK_TIMEOUT_S", 5.0, minimum=0.1)
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    for _name, _value in {
        "connect_timeout": OPENRELAY_DB_CONNECT_TIMEOUT_S,
        "keepalives": 1,
        "keepalives_idle": OPENRELAY_DB_KEEPALIVE_IDLE_S,
        "keepalives_interval": OPENRELAY_DB_KEEPALIVE_INTERVAL_S,
        "keepalives_count": OPENRELAY_DB_KEEPALIVE_COUNT,
        "tcp_user_timeout": OPENRELAY_DB_TCP_USER_TIMEOUT_S * 1000,
    }.items():
        DATABASES["default"].setdefault("OPTIONS", {}).setdefault(_name, _value)
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets the web process read while a worker writes; the busy timeout
    # turns "database is locked" into a short wait. A checkpoint every 10,000
    # pages (~40 MB of WAL) instead of SQLite's 1,000: each one fsyncs while
    # its writer holds the lock, and at 1,000 they cost a worker's flushes
    # ~15% of their time (tests/perf measures flushes).
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA wal_autocheckpoint=10000;",
        "transaction_mode": "IMMEDIATE",
    }
    # A file, not memory: tests hand the test database to real worker
    # processes. One per test process, so parallel runs don't share it.
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / f"test_openrelay_{os.getpid()}.sqlite3")}
else:
    DATABASES["default"]["TEST"] = {"NAME": f"test_{DATABASES['default']['NAME']}_{os.getpid()}"}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = envstr("REDIS_URL", "")

if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # Groups are named by organization and batch ids; the prefix keeps two
            # deployments sharing one Redis database apart.
            "CONFIG": {"hosts": [REDIS_URL], "prefix": envstr("OPENRELAY_CHANNEL_PREFIX", "openrelay")},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# The cache holds rate-limit counters (openrelay.api.throttles): shared by every
# web process through Redis in production, in process memory by default.
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "openrelay",
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

Q_CLUSTER = {
    "name": "openrelay",
    # Each worker process runs one engine (a thread: batches.engine.process)
    # beside the q2 tasks it executes; tasks are short (sweeps, webhook
    # deliveries, file expiry), so none holds a worker for long.
    "workers": envint("OPENRELAY_Q_WORKERS", 2, minimum=1),
    # Never recycle a worker process after N tasks: that would stop its engine,
    # cutting every call in flight after the grace period. The tasks are small.
    "recycle": 0,
    "timeout": envint("OPENRELAY_Q_TIMEOUT_S", 600, minimum=10),
    "retry": envint("OPENRELAY_Q_TIMEOUT_S", 600, minimum=10) + 60,
    "max_attempts": 1,
    "ack_failures": True,
    "catch_up": False,
    "save_limit": 1000,
    "label": "Tasks",
    "poll": 0.1,
}
if REDIS_URL:
    Q_CLUSTER["redis"] = REDIS_URL
else:
    Q_CLUSTER["orm"] = "default"

# Where file bytes live: a local folder, or s3://bucket/prefix?endpoint_url=... (files.storage).
OPENRELAY_STORAGE_URL = envstr("OPENRELAY_STORAGE_URL", "")
# Each S3 call's bounds: a down or hung store answers 503 in seconds (files.storage).
OPENRELAY_STORAGE_CONNECT_TIMEOUT_S = envfloat("OPENRELAY_STORAGE_CONNECT_TIMEOUT_S", 5.0, minimum=0.1)
OPENRELAY_STORAGE_READ_TIMEOUT_S = envfloat("OPENRELAY_STORAGE_READ_TIMEOUT_S", 30.0, minimum=0.1)
OPENRELAY_STORAGE_ATTEMPTS = envint("OPENRELAY_STORAGE_ATTEMPTS", 2, minimum=1)
# /readyz's look at the bucket: its timeout, and how long its answer is reused (openrelay.web.probes).
OPENRELAY_READYZ_STORAGE_TIMEOUT_S = envfloat("OPENRELAY_READYZ_STORAGE_TIMEOUT_S", 2.0, minimum=0.1)
OPENRELAY_READYZ_STORAGE_CACHE_S = envfloat("OPENRELAY_READYZ_STORAGE_CACHE_S", 5.0, minimum=0)
STORAGES = {
    "default": storage_from_url(
        OPENRELAY_STORAGE_URL,
        str(DATA_DIR / "files"),
        connect_timeout_s=OPENRELAY_STORAGE_CONNECT_TIMEOUT_S,
        read_timeout_s=OPENRELAY_STORAGE_READ_TIMEOUT_S,
        attempts=OPENRELAY_STORAGE_ATTEMPTS,
    ),
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "static"
# WhiteNoise serves static/ straight from the finders, so no collectstatic step is needed.
WHITENOISE_USE_FINDERS = True
STATIC_ROOT.mkdir(exist_ok=True)  # where collectstatic writes; WhiteNoise warns while it is missing

# Uploads stream to a temporary file beyond 2.5 MB; never held whole in memory.
FILE_UPLOAD_MAX_MEMORY_SIZE = 2_621_440
FILE_UPLOAD_TEMP_DIR = str(DATA_DIR / "tmp")
(DATA_DIR / "tmp").mkdir(exist_ok=True)
DATA_UPLOAD_MAX_MEMORY_SIZE = envint("OPENRELAY_MAX_JSON_BODY_BYTES", 10 * 1024 * 1024, minimum=1024)
# A Message Batch create (POST /v1/messages/batches) carries its requests inline: Anthropic takes 256 MB.
# The body spools to disk as it arrives; parsing holds it and its objects in the web process (tests/perf/
# bench_message_batches.py measures the peak).
OPENRELAY_MAX_MESSAGE_BATCH_BYTES = envint("OPENRELAY_MAX_MESSAGE_BATCH_BYTES", 256 * 1024 * 1024, minimum=1024)
# A request's head (request line and headers) in all; past it 431 (openrelay.web.webserver).
OPENRELAY_MAX_HEADER_BYTES = envint("OPENRELAY_MAX_HEADER_BYTES", 64 * 1024, minimum=1024)
# ... and the time it may take to arrive; past it 408 and the connection closed (openrelay.web.webserver).
OPENRELAY_HEADER_TIMEOUT_S = envfloat("OPENRELAY_HEADER_TIMEOUT_S", 10.0, minimum=0.1)

# How long a web process reuses an API key's row it has read (openrelay.core.auth); 0: read it every request.
OPENRELAY_API_KEY_CACHE_S = envfloat("OPENRELAY_API_KEY_CACHE_S", 5.0, minimum=0)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["openrelay.core.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": [
        "rest_framework.parsers.JSONParser",
        "rest_framework.parsers.MultiPartParser",
        "rest_framework.parsers.FormParser",
    ],
    "EXCEPTION_HANDLER": "openrelay.api.handlers.api_exception_handler",
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
# Batch creates per organization (every key of the organization shares it):
# N/second|minute|hour|day. Over it: 429 rate_limit_exceeded with Retry-After.
OPENRELAY_BATCH_CREATE_RATE = envrate("OPENRELAY_BATCH_CREATE_RATE", "2000/hour")
# Quotes per organization (the API's and the dashboard's, one budget): each reads the whole file and asks
# the model server's tokenizer up to 200 times, so a burst of them is bounded (issue 56: 48 at once stalled
# the web tier). Over it: 429 rate_limit_exceeded with Retry-After.
OPENRELAY_BATCH_ESTIMATE_RATE = envrate("OPENRELAY_BATCH_ESTIMATE_RATE", "10/minute")
SPECTACULAR_SETTINGS = {
    "TITLE": "OpenRelay Batch API",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "DESCRIPTION": "OpenAI-compatible Files and Batches API. Authenticate with `Authorization: Bearer or_...`.",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "openrelay.api.openapi.add_components",
        "batches.views.endpoint_enum",
    ],
}

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
LOGIN_URL = "/login"

# Hosts: with neither list set, one host serves everything (local development).
OPENRELAY_INFERENCE_HOSTS = envlist("OPENRELAY_INFERENCE_HOSTS")
OPENRELAY_CONTROL_HOSTS = envlist("OPENRELAY_CONTROL_HOSTS")
# User-supplied URLs (tool executors, MCP servers, workflow callbacks) may not
# reach private/loopback/metadata addresses unless this is true.
OPENRELAY_ALLOW_PRIVATE_URLS = envbool("OPENRELAY_ALLOW_PRIVATE_URLS", False)
# One webhook delivery attempt: connect, send, read the answer.
OPENRELAY_WEBHOOK_TIMEOUT_S = envfloat("OPENRELAY_WEBHOOK_TIMEOUT_S", 10.0, minimum=0.1)
# Deliveries are sent off the closer on a worker process's own threads (webhooks.sender): this
# many at once per process, at most ORG_CONCURRENCY of them one organization's.
OPENRELAY_WEBHOOK_CONCURRENCY = envint("OPENRELAY_WEBHOOK_CONCURRENCY", 8, minimum=1)
OPENRELAY_WEBHOOK_ORG_CONCURRENCY = envint("OPENRELAY_WEBHOOK_ORG_CONCURRENCY", 2, minimum=1)
# POST /v1/webhook_endpoints/{id}/test calls in flight per organization in one web process (429 past it).
OPENRELAY_WEBHOOK_TEST_CONCURRENCY = envint("OPENRELAY_WEBHOOK_TEST_CONCURRENCY", 2, minimum=1)
# Calls to user URLs from one engine (openrelay/lib/outbound.py): an organization has at most
# PER_ORGANIZATION in flight and a host (scheme, name, port) at most PER_HOST, set above it so one
# organization alone never fills a host. A call waits up to SLOT_WAIT_S for its slots before its
# own timeout starts. An MCP record runs at most TOOL_PARALLEL_CALLS of a turn's calls at once.
OPENRELAY_OUTBOUND_PER_ORGANIZATION = envint("OPENRELAY_OUTBOUND_PER_ORGANIZATION", 32, minimum=1)
OPENRELAY_OUTBOUND_PER_HOST = envint("OPENRELAY_OUTBOUND_PER_HOST", 64, minimum=1)
OPENRELAY_OUTBOUND_SLOT_WAIT_S = envfloat("OPENRELAY_OUTBOUND_SLOT_WAIT_S", 300.0, minimum=0.01)
OPENRELAY_TOOL_PARALLEL_CALLS = envint("OPENRELAY_TOOL_PARALLEL_CALLS", 8, minimum=1)

# GET /metrics is off until this is set; scrapers send it as "Authorization: Bearer <token>".
OPENRELAY_METRICS_TOKEN = envstr("OPENRELAY_METRICS_TOKEN", "")

# Engine knobs.
OPENRELAY_CALL_TIME_LIMIT_S = envfloat("OPENRELAY_CALL_TIME_LIMIT_S", 1800.0, minimum=0.01)
# One model answer's most bytes, on the wire and inflated (144 MB: 2,048 embeddings of
# 3,072 dimensions as JSON floats, ~137 MB, fit). Past it the server counts as failed.
OPENRELAY_MAX_MODEL_RESPONSE_BYTES = envint("OPENRELAY_MAX_MODEL_RESPONSE_BYTES", 144 * 1024 * 1024, minimum=1024)
# Bytes of model answers, as received, one engine (worker process) holds at once, read and waiting
# for their flush (batches.engine.calls.budget). Bytes, not memory: a held answer costs ~2-3x its bytes
# parsed, plus its JSON text again at the flush, so a worker peaks at ~5-7x this (issue 56: 2.4-2.7 GB
# for 512 MB), and grows past that over many big answers (docs/engine.md): a seventh of a worker's memory.
OPENRELAY_ENGINE_ANSWER_BUDGET_BYTES = envint("OPENRELAY_ENGINE_ANSWER_BUDGET_BYTES", 512 * 1024 * 1024, minimum=1024)
# The most result bytes one flush statement carries (PostgreSQL refuses a message over 1 GB).
OPENRELAY_FLUSH_MAX_BYTES = envint("OPENRELAY_FLUSH_MAX_BYTES", 64 * 1024 * 1024, minimum=1024)
# A batch whose answers in one flush hold this many bytes or more is written apart, on a database
# thread and connection of its own (batches.engine.apart), so the engine's other batches are claimed,
# called and written meanwhile (issue 55: another organization's 20 records waited 68.6 s behind 134 MB
# answers). 8 MB is a few thousand chat answers, written in well under a second. 0: never apart.
OPENRELAY_FLUSH_APART_BYTES = envint("OPENRELAY_FLUSH_APART_BYTES", 8 * 1024 * 1024, minimum=0)
# A model server that goes silent this long in the middle of its answer counts as failed.
OPENRELAY_MODEL_IDLE_TIMEOUT_S = envfloat("OPENRELAY_MODEL_IDLE_TIMEOUT_S", 60.0, minimum=0.01)
# Output contracts' answers checked off the event loop (batches.engine.checks): the checker processes
# one engine may start, one check's time limit (a normal check takes microseconds; a 144 MB answer
# parses in under a second), and a checker's address space (it starts at ~150 MB of it).
OPENRELAY_CONTRACT_CHECKERS = envint("OPENRELAY_CONTRACT_CHECKERS", 2, minimum=1)
OPENRELAY_CONTRACT_CHECK_TIME_LIMIT_S = envfloat("OPENRELAY_CONTRACT_CHECK_TIME_LIMIT_S", 2.0, minimum=0.01)
OPENRELAY_CONTRACT_CHECK_MEMORY_BYTES = envint(
    "OPENRELAY_CONTRACT_CHECK_MEMORY_BYTES", 1024 * 1024 * 1024, minimum=256 * 1024 * 1024
)
# The completion windows a batch may ask for, each with the share of the sync price it bills (a standard
# batch; expedited pays the sync price on any window): "1h:0.8,4h:0.65,24h:0.5,72h:0.4", units s, m, h, d.
# 24h at half price is OpenAI's one window (batches.windows).
OPENRELAY_COMPLETION_WINDOWS = envwindows("OPENRELAY_COMPLETION_WINDOWS", "24h:0.5")
# Reuse (batches.reuse, docs/guides/reuse.md): what a reused answer bills, as a share of its
# original's tokens (0: nothing; at most 1), and how long an answer stays in an organization's
# answer cache for its "cache" batches (the organization's own `reuse_cache_ttl_s` wins when set).
OPENRELAY_REUSE_BILL_SHARE = min(envfloat("OPENRELAY_REUSE_BILL_SHARE", 0.0, minimum=0.0), 1.0)
OPENRELAY_REUSE_CACHE_TTL_S = envint("OPENRELAY_REUSE_CACHE_TTL_S", 7 * 24 * 3600, minimum=0)
# A quote (POST /v1/batches/estimate) waits this long for one answer of a model server's tokenizer
# before it counts by the approximation instead (batches.estimate.tokens).
OPENRELAY_ESTIMATE_TOKENIZER_TIMEOUT_S = envfloat("OPENRELAY_ESTIMATE_TOKENIZER_TIMEOUT_S", 5.0, minimum=0.01)
# A quote's tokenizer calls take slots of the deployment's max_concurrency, shared by every web process
# (openrelay.lib.semaphores); a quote waits this long in all for them before it counts by the approximation.
OPENRELAY_ESTIMATE_TOKENIZER_WAIT_S = envfloat("OPENRELAY_ESTIMATE_TOKENIZER_WAIT_S", 10.0, minimum=0.0)
# A record is its engine's while the lease lives; engines renew theirs every
# quarter of it, so a dead engine's records are claimable again within this at worst (engines
# find a dead one within about a second: batches/engine/liveness.py).
OPENRELAY_LEASE_S = envint("OPENRELAY_LEASE_S", 10, minimum=1)
# An engine on another host that has not beaten for this long is dead (SQLite; on PostgreSQL an
# engine's death is its advisory lock's release, batches.engine.liveness).
OPENRELAY_ENGINE_DEAD_S = envfloat("OPENRELAY_ENGINE_DEAD_S", 3.0, minimum=1)
# How long a worker waits for a lost database connection to come back before its engine gives up.
OPENRELAY_DB_OUTAGE_S = envint("OPENRELAY_DB_OUTAGE_S", 60, minimum=0)
OPENRELAY_CLAIM_CHUNK = envint("OPENRELAY_CLAIM_CHUNK", 256, minimum=1)
# How often a 429 or a 503 with Retry-After (the server asks to wait) is waited out before it is the record's answer.
OPENRELAY_UPSTREAM_RETRIES = envint("OPENRELAY_UPSTREAM_RETRIES", 5, minimum=0)
# Guardrails (batches/guardrails.py). A call's worst case, reserved against a spend cap before it is
# sent, counts this many answer tokens when neither the request's max_tokens nor the model's
# max_output_tokens says fewer.
OPENRELAY_DEFAULT_MAX_OUTPUT_TOKENS = envint("OPENRELAY_DEFAULT_MAX_OUTPUT_TOKENS", 16384, minimum=1)
# The error breaker's defaults (a batch may set its own at create; 0 turns a rule off): pause when
# FAILURES of the first WINDOW finished records failed with one record-level code, or when
# CONSECUTIVE records in a row failed with one.
OPENRELAY_BREAKER_WINDOW = envint("OPENRELAY_BREAKER_WINDOW", 100, minimum=0)
OPENRELAY_BREAKER_FAILURES = envint("OPENRELAY_BREAKER_FAILURES", 20, minimum=0)
OPENRELAY_BREAKER_CONSECUTIVE = envint("OPENRELAY_BREAKER_CONSECUTIVE", 50, minimum=0)
# How often an engine reads again what organizations with a monthly budget have spent.
OPENRELAY_BUDGET_REFRESH_S = envfloat("OPENRELAY_BUDGET_REFRESH_S", 1.0, minimum=0.05)
# A stopping engine (SIGTERM) lets calls in flight finish for this long, then hands the rest back.
OPENRELAY_STOP_GRACE_S = envfloat("OPENRELAY_STOP_GRACE_S", 30.0, minimum=0)
# Adaptive concurrency (batches/engine/calls/flow.py): a deployment's max_concurrency is a
# ceiling; the engines' limits start at START (split over the live engines), stay at or above
# FLOOR, hold the calls estimated waiting inside the server to QUEUE_LINE of those in flight
# (0: off), back off when calls take more than TOLERANCE x their baseline, and stay under
# what a 503 showed for CEILING_HOLD_S (0: off). Off: the limit is the ceiling.
OPENRELAY_ADAPTIVE_CONCURRENCY = envbool("OPENRELAY_ADAPTIVE_CONCURRENCY", True)
OPENRELAY_CONCURRENCY_FLOOR = envint("OPENRELAY_CONCURRENCY_FLOOR", 1, minimum=1)
OPENRELAY_CONCURRENCY_START = envint("OPENRELAY_CONCURRENCY_START", 16, minimum=1)
OPENRELAY_LATENCY_TOLERANCE = envfloat("OPENRELAY_LATENCY_TOLERANCE", 2.0, minimum=1.1)
OPENRELAY_QUEUE_LINE = envfloat("OPENRELAY_QUEUE_LINE", 0.25, minimum=0)
OPENRELAY_CEILING_HOLD_S = envfloat("OPENRELAY_CEILING_HOLD_S", 30.0, minimum=0)
# Prefix-aware dispatch (batches/engine/prefixes.py): records whose prompts share their
# first PREFIX_BYTES bytes are sent together (0: off), from a claim-ahead of PREFIX_WINDOW.
OPENRELAY_PREFIX_BYTES = envint("OPENRELAY_PREFIX_BYTES", 1024, minimum=0)
OPENRELAY_PREFIX_WINDOW = envint("OPENRELAY_PREFIX_WINDOW", 512, minimum=1)
# A deployment out of the rotation is probed with backoff up to this interval.
OPENRELAY_PROBE_MAX_S = envfloat("OPENRELAY_PROBE_MAX_S", 10.0, minimum=0.1)
# Run an engine in each q2 worker process (off: the cluster runs only tasks).
OPENRELAY_ENGINE = envbool("OPENRELAY_ENGINE", True)
OPENRELAY_MAX_UPLOAD_BYTES = envint("OPENRELAY_MAX_UPLOAD_BYTES", 209_715_200, minimum=1)
# Requests running views at once in one web process (each holds a database
# connection); more wait their turn. Keep (web processes x this) + workers
# under the database's max_connections.
OPENRELAY_WEB_CONCURRENCY = envint("OPENRELAY_WEB_CONCURRENCY", 32, minimum=1)

# text (the default) or json: one JSON object a line with batch and record ids (openrelay.lib.logs).
OPENRELAY_LOG_FORMAT = envstr("OPENRELAY_LOG_FORMAT", "text").strip().lower() or "text"
if OPENRELAY_LOG_FORMAT not in ("text", "json"):
    raise ImproperlyConfiguredEnv(f"OPENRELAY_LOG_FORMAT must be text or json, got {OPENRELAY_LOG_FORMAT!r}")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "openrelay.lib.logs.JsonFormatter"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            **({"formatter": "json"} if OPENRELAY_LOG_FORMAT == "json" else {}),
        }
    },
    "root": {"handlers": ["console"], "level": envstr("OPENRELAY_LOG_LEVEL", "INFO")},
    "loggers": {
        "django.server": {"level": "WARNING"},
        # Django logs every 4xx answer as a warning ("Not Found: ..."): a client's mistake, answered in the
        # error envelope, is no news to the operator (2,354 lines in 4 minutes of fuzzing under `up`); 5xx stay.
        "django.request": {"level": "ERROR"},
        "daphne": {"level": "WARNING"},
        "django_q": {"level": "WARNING"},
        # httpx logs every request it sends at INFO: a quote's 200 tokenizer calls were 200 lines.
        "httpx": {"level": "WARNING"},
        # uvicorn gives its loggers handlers of its own before it loads the application; in json,
        # theirs become ours too, so a web process writes no plain line ("Started server process").
        **(
            {name: {"handlers": ["console"], "propagate": False} for name in ("uvicorn", "uvicorn.access")}
            if OPENRELAY_LOG_FORMAT == "json"
            else {}
        ),
    },
}
