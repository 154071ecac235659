"""trajplatform settings: one module, every knob from an environment variable.

Each knob has an embedded default that works on a fresh machine with no services
(SQLite, django-q2's ORM broker, channels' in-memory layer, the bubblewrap sandbox, the
offline scripted model). docs/configuration.md lists every knob here;
keep the two in step.
"""
from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in env_str(name, default).split(",") if item.strip()]


# Local state (SQLite file, generated secret key, exports) lives in one git-ignored folder.
VAR_DIR = Path(env_str("TRAJ_VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)


def _secret_key() -> str:
    key = env_str("DJANGO_SECRET_KEY")
    if key:
        return key
    path = VAR_DIR / "secret_key"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    key = secrets.token_urlsafe(50)
    # O_EXCL: two processes starting at once must not write two different keys.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as fh:
        fh.write(key)
    return key


SECRET_KEY = _secret_key()
# The systemd units' EnvironmentFile (deploy/trajplatform.env.example): `manage.py check --deploy`
# warns (trajplatform.W001) when it is readable by other users; keep it 0600. Empty: no check.
TRAJ_ENV_FILE = env_str("TRAJ_ENV_FILE", "/etc/trajplatform.env")
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", "")

# Behind TLS in production: DJANGO_HTTPS=1 turns on every transport-security setting
# that `manage.py check --deploy` asks for. Off by default so `make serve` works over http.
HTTPS = env_bool("DJANGO_HTTPS", False)
SECURE_SSL_REDIRECT = HTTPS
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 31536000 if HTTPS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = HTTPS
SECURE_HSTS_PRELOAD = HTTPS
if HTTPS:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_q",
    "channels",
    "trajplatform",
    "apps.tasks",
    "apps.engines",
    "apps.reviews",
    "apps.datasets",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "trajplatform.api.ApiBodyLimitMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "trajplatform.urls"
WSGI_APPLICATION = "trajplatform.wsgi.application"
ASGI_APPLICATION = "trajplatform.asgi.application"

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

# --- database -----------------------------------------------------------------------
DATABASE_URL = env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'db.sqlite3'}")
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=env_int("DB_CONN_MAX_AGE", 0))}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Workers and the web server share one file: wait for locks instead of failing, take
    # the write lock at BEGIN so two writers never deadlock on upgrade, WAL for readers.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # A file (not :memory:) so live-server tests can share it with subprocesses; one per
    # process so parallel test runs never collide.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / f"test_db_{os.getpid()}.sqlite3")}
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # PostgreSQL compiles a query with LLVM (JIT) when its estimated cost passes jit_above_cost;
    # the console's queues (correlated subqueries, estimated per row of the table) pass it while
    # they run in milliseconds, and compiling them took 1-5 s per page at 100k trajectories
    # (docs/benchmarks.md). Off for the platform's sessions; a DATABASE_URL with its own
    # `?options=...` replaces this (add `-c jit=off` there to keep it).
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("options", "-c jit=off")
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(VAR_DIR / "static")))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise warns on every request otherwise
MEDIA_ROOT = Path(env_str("MEDIA_ROOT", str(VAR_DIR / "media")))
# The artifact store (trajplatform/artifacts.py: screenshots by content hash): any Django storage
# backend (e.g. django-storages' "storages.backends.s3.S3Storage") with its options as JSON;
# by default files under MEDIA_ROOT/artifacts.
ARTIFACTS_STORAGE_BACKEND = env_str("ARTIFACTS_STORAGE_BACKEND", "django.core.files.storage.FileSystemStorage")
ARTIFACTS_STORAGE_OPTIONS = json.loads(env_str("ARTIFACTS_STORAGE_OPTIONS", "") or "null") or (
    {"location": str(MEDIA_ROOT / "artifacts")}
    if ARTIFACTS_STORAGE_BACKEND == "django.core.files.storage.FileSystemStorage" else {})
# Images the platform did not make (imports, a browser's or a device's screenshots, MCP results)
# are measured from their header before anything decodes them (trajplatform/images.py): more
# bytes or pixels than this is refused. 20 MB is OpenAI's per-image input limit; 25 megapixels
# holds a 5000x5000 page or any phone screen, and stays under Pillow's bomb warning (89 MP).
IMAGE_MAX_BYTES = env_int("IMAGE_MAX_BYTES", 20_000_000)
IMAGE_MAX_PIXELS = env_int("IMAGE_MAX_PIXELS", 25_000_000)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
    "artifacts": {"BACKEND": ARTIFACTS_STORAGE_BACKEND, "OPTIONS": ARTIFACTS_STORAGE_OPTIONS},
}
LOGIN_URL = "admin:login"

# --- queue and live updates -----------------------------------------------------------
REDIS_URL = env_str("REDIS_URL")
Q_CLUSTER = {
    "name": "trajplatform",
    "workers": env_int("Q_WORKERS", 2),
    "timeout": env_int("Q_TIMEOUT", 3600),
    # Must exceed timeout, or a long job is handed to a second worker while still running.
    "retry": env_int("Q_TIMEOUT", 3600) + 300,
    "max_attempts": 3,
    "queue_limit": 50,
    "bulk": 10,
    "poll": 0.5,
    "catch_up": False,
    # django-q2 prunes results beyond 250 by default; keep them (the console shows them).
    "save_limit": 0,
    "ack_failures": True,
    "log_level": env_str("Q_LOG_LEVEL", "INFO"),
    "sync": env_bool("Q_SYNC", False),
}
if REDIS_URL:
    Q_CLUSTER["redis"] = REDIS_URL
    # redis-py 8 reads with a 5 s socket timeout by default, and channels-redis's receive() is a
    # 5 s BZPOPMIN: an idle websocket's consumer died with "Timeout reading from" every 5 s
    # (channels_redis issue 422). A read timeout above the BZPOPMIN's keeps a dead Redis
    # detectable.
    CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                    "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 15}]}}
    }
else:
    Q_CLUSTER["orm"] = "default"
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# --- sandboxes --------------------------------------------------------------------------
SANDBOX_BACKEND = env_str("SANDBOX_BACKEND", "local")
SANDBOX_ALLOW_UNISOLATED = env_bool("SANDBOX_ALLOW_UNISOLATED", False)
SANDBOX_ROOT = Path(env_str("SANDBOX_ROOT", "/var/tmp/trajplatform-sandboxes"))
SANDBOX_POOL_SIZE = env_int("SANDBOX_POOL_SIZE", 0)
# Warm pools per image (apps/engines/sandboxes/pool.py): "image=size,..." beside the default shape's.
SANDBOX_POOL_IMAGES = env_str("SANDBOX_POOL_IMAGES")
OPENSANDBOX_URL = env_str("OPENSANDBOX_URL")
OPENSANDBOX_API_KEY = env_str("OPENSANDBOX_API_KEY")
OPENSANDBOX_USE_SERVER_PROXY = env_bool("OPENSANDBOX_USE_SERVER_PROXY", False)
OPENSANDBOX_DEFAULT_IMAGE = env_str("OPENSANDBOX_DEFAULT_IMAGE", "python:3.11")

# --- rollouts --------------------------------------------------------------------------
# One worker job claims up to ROLLOUT_CONCURRENCY queued trajectories and runs them at once
# (the model call is I/O bound). A running trajectory whose heartbeat is older than
# ROLLOUT_STALE_S is re-queued by the reaper, at most ROLLOUT_MAX_ATTEMPTS times in all.
ROLLOUT_CONCURRENCY = env_int("ROLLOUT_CONCURRENCY", 8)
ROLLOUT_HEARTBEAT_S = env_float("ROLLOUT_HEARTBEAT_S", 10.0)
ROLLOUT_STALE_S = env_float("ROLLOUT_STALE_S", 120.0)
ROLLOUT_MAX_ATTEMPTS = env_int("ROLLOUT_MAX_ATTEMPTS", 3)
# A claim whose worker died (killed, restarted, out of memory) does not count against the
# attempts: the trajectory is re-queued, and ends as an error after this many such losses.
ROLLOUT_MAX_WORKER_LOSSES = env_int("ROLLOUT_MAX_WORKER_LOSSES", 10)
# Cost budgets (apps/tasks/budgets.py): batches and users have their own (set in the console or
# the API); BUDGET_DAILY_USD caps what the whole platform spends per UTC day (0: no cap). Each
# process re-reads the spend every BUDGET_REFRESH_S.
BUDGET_DAILY_USD = env_float("BUDGET_DAILY_USD", 0.0)
BUDGET_REFRESH_S = env_float("BUDGET_REFRESH_S", 5.0)

# --- LLM ------------------------------------------------------------------------------
# Providers (apps.engines.llm.resolve_providers, docs/llm.md): LLM_PROVIDERS names them in
# order; else LLM_BASE_URL / LLM_API_KEY form one (a key alone means DeepSeek); else every
# provider whose own key variable is set (DEEPSEEK_API_KEY, OPENAI_API_KEY, GEMINI_API_KEY, ...,
# in profile order); only with none of these, the offline scripted model (a labelled stand-in,
# model "scripted-reference") at OFFLINE_MODEL_URL. What each provider accepts comes from its
# profile (apps/engines/profiles.json); LLM_PROFILES (a JSON file path or inline JSON) is merged
# over it, and LLM_PROFILE names the profile of an LLM_BASE_URL on an unknown host.
LLM_BASE_URL = env_str("LLM_BASE_URL")
LLM_API_KEY = env_str("LLM_API_KEY")
LLM_MODEL = env_str("LLM_MODEL")
LLM_PROVIDERS = env_str("LLM_PROVIDERS")
LLM_PROFILES = env_str("LLM_PROFILES")
LLM_PROFILE = env_str("LLM_PROFILE")
# Before a batch starts, the configured models are checked against the profile's retired names
# and the provider's GET /models (not reaching it in this many seconds is not an error).
LLM_MODEL_CHECK_TIMEOUT_S = env_float("LLM_MODEL_CHECK_TIMEOUT_S", 5.0)
LLM_TIMEOUT_S = env_float("LLM_TIMEOUT_S", 120.0)
LLM_MAX_RETRIES = env_int("LLM_MAX_RETRIES", 5)
LLM_MAX_CONCURRENCY = env_int("LLM_MAX_CONCURRENCY", 16)
OFFLINE_MODEL_URL = env_str("OFFLINE_MODEL_URL", "http://127.0.0.1:8765/v1")

CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    # Responses keyed by a hash of model, messages, tools and sampling parameters: a resumed
    # batch does not pay twice. Never culled or expired; shared through Redis in production.
    "llm": (
        {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL, "TIMEOUT": None,
         "KEY_PREFIX": "llm"}
        if REDIS_URL
        # One SQLite file for the machine's workers (apps.engines.llm.LLMResponseCache).
        else {"BACKEND": "apps.engines.llm.LLMResponseCache", "LOCATION": str(VAR_DIR / "llm-cache"),
              "TIMEOUT": None}
    ),
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.SessionAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
}

LOG_LEVEL = env_str("LOG_LEVEL", "INFO")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django": {"handlers": ["console"], "level": "INFO", "propagate": False},
        # Client libraries log every HTTP request at INFO.
        "httpx": {"level": "WARNING"},
        "httpcore": {"level": "WARNING"},
        "httpx2": {"level": "WARNING"},
        "httpcore2": {"level": "WARNING"},
        "opensandbox": {"level": "WARNING"},
    },
}

# --- datasets -----------------------------------------------------------------------------
# Export files (server-side exports, downloadable from the version page) live under
# DATASET_EXPORT_DIR/<dataset>/v<N>/. Near-duplicate dedup compares sentence embeddings of the
# task prompt and of the action sequence; both cosines at or above the threshold = duplicate.
DATASET_EXPORT_DIR = Path(env_str("DATASET_EXPORT_DIR", str(VAR_DIR / "exports")))
DATASET_DEDUP_THRESHOLD = env_float("DATASET_DEDUP_THRESHOLD", 0.92)
DATASET_VALIDATION_FRACTION = env_float("DATASET_VALIDATION_FRACTION", 0.1)
DATASET_EXPORT_CHUNK = env_int("DATASET_EXPORT_CHUNK", 2000)
# Rows per Parquet shard of a Hugging Face layout export (data/<split>-0000i-of-0000n.parquet).
DATASET_HF_SHARD_ROWS = env_int("DATASET_HF_SHARD_ROWS", 10000)
DATASET_EMBED_BATCH = env_int("DATASET_EMBED_BATCH", 64)
# Near-duplicate dedup compares all pairs of unique prompts up to this many; above it, an ANN index.
DATASET_DEDUP_EXACT_MAX = env_int("DATASET_DEDUP_EXACT_MAX", 20000)
# A finished iteration's dedup texts are embedded by a worker job (kept for every later version).
DATASET_EMBED_ON_FINISH = env_bool("DATASET_EMBED_ON_FINISH", True)
# Chat templates named by `dataset_export --check-template NAME` (NAME.jinja) and benchmark test sets
# named by decontamination (NAME.jsonl / NAME.txt): files an operator puts there, never downloaded.
DATASET_CHAT_TEMPLATE_DIR = Path(env_str("DATASET_CHAT_TEMPLATE_DIR", str(VAR_DIR / "chat_templates")))
DATASET_TESTSET_DIR = Path(env_str("DATASET_TESTSET_DIR", str(VAR_DIR / "testsets")))

# --- REST API, webhooks, health, skills (trajplatform/api.py, webhooks.py, health.py, skills.py)
API_THROTTLE_RATE = env_str("API_THROTTLE_RATE", "600/min")  # per API token (or per user for sessions)
# Throttle counters: shared by every server process through Redis when REDIS_URL is set.
CACHES["api"] = (
    {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL, "KEY_PREFIX": "api"}
    if REDIS_URL
    else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "api"}
)
API_PAGE_SIZE = env_int("API_PAGE_SIZE", 50)
API_MAX_PAGE_SIZE = env_int("API_MAX_PAGE_SIZE", 500)
API_MAX_TASKS_PER_REQUEST = env_int("API_MAX_TASKS_PER_REQUEST", 1000)
# Client input limits, checked before anything is parsed (trajplatform/json_limits.py): a body
# larger than API_MAX_BODY_BYTES is a JSON 413 (API) / 400 (console forms), JSON nested deeper
# than API_MAX_JSON_DEPTH levels a 400.
API_MAX_BODY_BYTES = env_int("API_MAX_BODY_BYTES", 32 << 20)
API_MAX_JSON_DEPTH = env_int("API_MAX_JSON_DEPTH", 64)
DATA_UPLOAD_MAX_MEMORY_SIZE = API_MAX_BODY_BYTES
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "trajplatform.api.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["trajplatform.api.RolePermission"],
    "DEFAULT_THROTTLE_CLASSES": ["trajplatform.api.TokenRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"token": API_THROTTLE_RATE},
    "DEFAULT_PAGINATION_CLASS": "trajplatform.api.IdCursorPagination",
    "PAGE_SIZE": API_PAGE_SIZE,
    "DEFAULT_FILTER_BACKENDS": ["trajplatform.api.StrictFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "trajplatform.api.error_handler",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer", "rest_framework.renderers.BrowsableAPIRenderer"],
    "DEFAULT_PARSER_CLASSES": [
        "trajplatform.api.LimitedJSONParser",
        "rest_framework.parsers.MultiPartParser",
        "rest_framework.parsers.FormParser",
    ],
    "NON_FIELD_ERRORS_KEY": "non_field_errors",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "trajplatform API",
    "DESCRIPTION": "Submit and track trajectory synthesis, review proposals, export datasets.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "trajplatform.api.add_error_responses",
    ],
    "ENUM_NAME_OVERRIDES": {
        "TaskStatusEnum": "apps.tasks.models.TaskStatus",
        "TrajectoryStatusEnum": "apps.tasks.models.TrajectoryStatus",
        "ProposalStatusEnum": "apps.reviews.models.Proposal.Status",
        "ReviewStatusEnum": "apps.reviews.models.Review.Status",
        "ReviewAssignmentStatusEnum": "apps.reviews.models.ReviewAssignment.Status",
        "VersionStatusEnum": "apps.datasets.models.DatasetVersion.Status",
        "ExportStatusEnum": "apps.datasets.models.ExportJob.Status",
        "OutcomeEnum": "apps.tasks.models.Trajectory.Outcome",
        "ImportOutcomeEnum": ["success", "failure"],
    },
}
# Swagger UI served from this server (drf-spectacular-sidecar, in INSTALLED_APPS), never from a CDN.
SPECTACULAR_SETTINGS.update(SWAGGER_UI_DIST="SIDECAR", SWAGGER_UI_FAVICON_HREF="SIDECAR", REDOC_DIST="SIDECAR")
WEBHOOK_URL = env_str("WEBHOOK_URL")  # the global endpoint (review notifications); empty: none
WEBHOOK_SECRET = env_str("WEBHOOK_SECRET")  # its HMAC-SHA256 signing key (required with WEBHOOK_URL)
WEBHOOK_EVENTS = env_list("WEBHOOK_EVENTS", "proposal.created,proposal.decided")
WEBHOOK_TIMEOUT_S = env_float("WEBHOOK_TIMEOUT_S", 10.0)
WEBHOOK_MAX_ATTEMPTS = env_int("WEBHOOK_MAX_ATTEMPTS", 6)
WEBHOOK_BACKOFF_S = env_float("WEBHOOK_BACKOFF_S", 10.0)
WEBHOOK_BACKOFF_MAX_S = env_float("WEBHOOK_BACKOFF_MAX_S", 3600.0)
# Registered callback URLs may resolve to loopback/private/link-local addresses (off: public only).
WEBHOOKS_ALLOW_PRIVATE_TARGETS = env_bool("WEBHOOKS_ALLOW_PRIVATE_TARGETS", False)
if WEBHOOK_URL and not WEBHOOK_SECRET:
    raise ImproperlyConfigured("WEBHOOK_URL is set but WEBHOOK_SECRET is empty: deliveries must be signed")
HEALTH_LLM_TIMEOUT_S = env_float("HEALTH_LLM_TIMEOUT_S", 2.0)
HEALTH_QUEUE_STALE_S = env_float("HEALTH_QUEUE_STALE_S", 120.0)
# Scene packages outside apps/engines/scenes (each with a scene.py: docs/new-scene.md), comma-separated.
SCENE_PACKAGES = env_list("SCENE_PACKAGES", "")
PLATFORM_SKILLS_URL = env_str("PLATFORM_SKILLS_URL")  # VibeDataBot; set: only its active skills' scenes
PLATFORM_SKILLS_TIMEOUT_S = env_float("PLATFORM_SKILLS_TIMEOUT_S", 5.0)
# EnvScaler scene (apps/engines/scenes/envscaler): the sandbox image/profile whose python3 has fastmcp
# (local: the profile binding SANDBOX_PYTHON_PACKAGES read-only; empty = this interpreter's
# site-packages), how long the in-sandbox MCP server may take to start, and import validation.
ENVSCALER_SANDBOX_IMAGE = env_str("ENVSCALER_SANDBOX_IMAGE", "trajplatform-python")
SANDBOX_PYTHON_PACKAGES = env_str("SANDBOX_PYTHON_PACKAGES", "")
# The bundled MCP servers' packages (requirements-mcp.lock), bound read-only by the local sandbox
# profile trajplatform-mcp next to SANDBOX_PYTHON_PACKAGES (empty = <virtualenv>/mcp-packages).
SANDBOX_MCP_PACKAGES = env_str("SANDBOX_MCP_PACKAGES", "")
ENVSCALER_START_TIMEOUT_S = env_float("ENVSCALER_START_TIMEOUT_S", 60.0)
ENVSCALER_VALIDATE_TIMEOUT_S = env_float("ENVSCALER_VALIDATE_TIMEOUT_S", 120.0)
ENVSCALER_MCP_PORT = env_int("ENVSCALER_MCP_PORT", 8000)  # OpenSandbox: the port the environment serves MCP on
ENVSCALER_MCP_HOST = env_str("ENVSCALER_MCP_HOST", "0.0.0.0")
# The gui scene's browser server over streamable HTTP on backends without pipes (OpenSandbox):
# each sandbox has its own network, so one fixed port serves every episode (docs/gui.md).
GUI_MCP_PORT = env_int("GUI_MCP_PORT", 8931)
GUI_MCP_HOST = env_str("GUI_MCP_HOST", "0.0.0.0")
# Web toolset (apps/engines/web, docs/web.md): corpora built by `manage.py corpus_build` live in
# WEB_CORPUS_DIR; a task's scene_config.web.corpus defaults to WEB_CORPUS_DEFAULT. The live backend
# searches with ddgs (or the SearXNG JSON API at WEB_SEARXNG_URL), fetches public addresses only
# (WEB_ALLOW_PRIVATE_TARGETS=1 allows private ones: tests' loopback servers), at most
# WEB_RATE_PER_S requests a second per worker, each within WEB_FETCH_TIMEOUT_S and WEB_MAX_PAGE_BYTES.
WEB_CORPUS_DIR = Path(env_str("WEB_CORPUS_DIR", str(VAR_DIR / "corpora")))
WEB_CORPUS_DEFAULT = env_str("WEB_CORPUS_DEFAULT", "debian-docs")
# corpus_build --from DIRECTORY leaves out (and names) any file larger than this.
WEB_CORPUS_MAX_FILE_BYTES = env_int("WEB_CORPUS_MAX_FILE_BYTES", 10_000_000)
WEB_SEARXNG_URL = env_str("WEB_SEARXNG_URL")
WEB_ALLOW_PRIVATE_TARGETS = env_bool("WEB_ALLOW_PRIVATE_TARGETS", False)
WEB_RATE_PER_S = env_float("WEB_RATE_PER_S", 2.0)
WEB_FETCH_TIMEOUT_S = env_float("WEB_FETCH_TIMEOUT_S", 15.0)
WEB_MAX_PAGE_BYTES = env_int("WEB_MAX_PAGE_BYTES", 5_000_000)

# --- reviews (apps/reviews) ---------------------------------------------------------------
# The judge is the configured LLM (LLM_* / LLM_PROVIDERS above); REVIEW_JUDGE_MODEL asks the
# primary provider for another model. A judge that fails is retried every
# REVIEW_JUDGE_RETRY_MINUTES, at most REVIEW_JUDGE_MAX_ATTEMPTS calls per review; its review
# stays `judge_failed` (no score) until one succeeds.
REVIEW_QUALITY_THRESHOLD = env_int("REVIEW_QUALITY_THRESHOLD", 80)
REVIEW_STALE_PROPOSAL_HOURS = env_float("REVIEW_STALE_PROPOSAL_HOURS", 24.0)
REVIEW_JUDGE_MODEL = env_str("REVIEW_JUDGE_MODEL")
REVIEW_JUDGE_MAX_TOKENS = env_int("REVIEW_JUDGE_MAX_TOKENS", 2000)
REVIEW_JUDGE_RETRY_MINUTES = env_int("REVIEW_JUDGE_RETRY_MINUTES", 5)
REVIEW_JUDGE_MAX_ATTEMPTS = env_int("REVIEW_JUDGE_MAX_ATTEMPTS", 5)
# The human review queue (/review/work/, docs/console.md): distinct human verdicts each trajectory
# takes, how long a claim reserves an item, and the share of auto-accepted trajectories (score at or
# above the task's threshold) routed to humans as a sampled audit.
REVIEW_REVIEWERS_PER_ITEM = env_int("REVIEW_REVIEWERS_PER_ITEM", 1)
REVIEW_CLAIM_MINUTES = env_float("REVIEW_CLAIM_MINUTES", 30.0)
REVIEW_AUDIT_SHARE = env_float("REVIEW_AUDIT_SHARE", 0.1)

# --- dataset exports ---------------------------------------------------------------------
# Exports always redact configured secrets, API-key shapes, bearer tokens and private keys;
# with EXPORT_REDACT_PII they also replace e-mail addresses and phone numbers.
EXPORT_REDACT_PII = env_bool("EXPORT_REDACT_PII", False)
