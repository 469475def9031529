"""Typed daemon settings, from defaults < TOML file < environment < command-line flags.

One table (``FIELDS``) describes every setting once; the argparse flags, the
``SHUFFLED_*`` environment names, the TOML keys and the generated configuration reference
(docs/configuration.md) all come from it, so they cannot drift apart.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from shuffled.config.values import (
    LocationSettings, parse_deep_storage_uri, parse_nonnegative_int, parse_optional_str, parse_locations, parse_port,
    parse_positive_int, parse_bool, parse_duration, parse_size,
)
from shuffled.errors import ConfigError
from shuffled.tokens import read_secrets

__all__ = ["ENV_PREFIX", "FIELDS", "FIELD_BY_NAME", "Field", "LocationSettings", "Settings",
           "load_settings", "parse_bool", "parse_duration", "parse_size", "reference_markdown"]

ENV_PREFIX = "SHUFFLED_"

@dataclass(frozen=True)
class Field:
    """How one setting is parsed and documented."""

    name: str
    parse: Callable[[Any, str], Any]
    help: str
    flag: str
    metavar: str = "VALUE"
    repeatable: bool = False


FIELDS: tuple[Field, ...] = (
    Field("host", lambda v, n: str(v), "address to listen on", "--host", "HOST"),
    Field("port", parse_port, "TCP port (0 picks a free one)", "--port", "PORT"),
    Field("locations", parse_locations,
          "storage location PATH[:MAX_BYTES]; repeat for several disks (writes go round-robin)",
          "--location", "PATH[:MAX_BYTES]", repeatable=True),
    Field("free_space_reserve", parse_size,
          "free bytes to leave on each location's file system", "--free-space-reserve", "SIZE"),
    Field("max_partial_bytes", parse_size,
          "largest partial segment accepted (413 above)", "--max-partial-bytes", "SIZE"),
    Field("fsync", parse_bool,
          "sync each partial segment and its index entry before acknowledging it (durable "
          "against power loss; uploads committing together share the syncs)",
          "--fsync", "BOOL"),
    Field("pack_max_bytes", parse_size,
          "partial segments of a task are appended to pack files of up to this size",
          "--pack-max-bytes", "SIZE"),
    Field("auth_token_file", parse_optional_str,
          "file holding the bearer token every request must carry, except /status/health "
          "and (unless metrics_require_auth) /metrics; env SHUFFLED_AUTH_TOKEN gives the token",
          "--auth-token-file", "PATH"),
    Field("auth_token", parse_optional_str, "the bearer token itself (prefer the file or the env var)",
          "--auth-token", "TOKEN"),
    Field("signing_secret_file", parse_optional_str,
          "file of secrets (one per line; the first signs, all verify: add the new one first "
          "to rotate) shared by the daemons and the ingestion drivers, which mint per-task "
          "read/write/admin tokens with it (docs/security.md); auth_token stays the operator's",
          "--signing-secret-file", "PATH"),
    Field("task_quota_bytes", parse_size,
          "most bytes one supervisor task may hold on this daemon (0: no limit; 507 above)",
          "--task-quota-bytes", "SIZE"),
    Field("task_quota_partials", parse_nonnegative_int,
          "most partial segments one supervisor task may hold on this daemon (0: no limit)",
          "--task-quota-partials", "N"),
    Field("metrics_require_auth", parse_bool,
          "whether /metrics needs the token too", "--metrics-require-auth", "BOOL"),
    Field("tls_cert", parse_optional_str, "PEM certificate chain: serve HTTPS", "--tls-cert", "PATH"),
    Field("tls_key", parse_optional_str, "PEM private key for --tls-cert", "--tls-key", "PATH"),
    Field("expiry_timeout", parse_duration,
          "a supervisor task's data expires this long after its last PUT/GET",
          "--expiry-timeout", "DURATION"),
    Field("sweep_period", parse_duration, "how often the expiry sweeper runs",
          "--sweep-period", "DURATION"),
    Field("overlord_url", parse_optional_str,
          "Druid overlord base URL asked whether an expired task still runs",
          "--overlord-url", "URL"),
    Field("max_age", parse_duration,
          "data is deleted past this age since last access even when the overlord is "
          "unreachable", "--max-age", "DURATION"),
    Field("max_concurrent_uploads", parse_positive_int,
          "uploads in flight before new ones get 503 + Retry-After",
          "--max-concurrent-uploads", "N"),
    Field("max_concurrent_downloads", parse_positive_int,
          "downloads in flight before new ones get 503 + Retry-After",
          "--max-concurrent-downloads", "N"),
    Field("upload_idle_timeout", parse_duration,
          "an upload whose body sends nothing for this long is abandoned (408) and its "
          "slot freed", "--upload-idle-timeout", "DURATION"),
    Field("max_lost_marks_bytes", parse_size,
          "memory the lost-daemon verdicts of every task may take (PUT .../lost past it: "
          "503 until older ones lapse)", "--max-lost-marks-bytes", "SIZE"),
    Field("max_bulk_partials", parse_positive_int,
          "partial segments one bulk upload may send (413 past it; each is held, ~1.5 KB, "
          "until the upload answers)", "--max-bulk-partials", "N"),
    Field("max_held_partials", parse_positive_int,
          "partial segments the bulk uploads in flight may hold together (each ~1.5 KB "
          "until its upload answers; at least max_bulk_partials): an upload past it gets "
          "503 + Retry-After", "--max-held-partials", "N"),
    Field("max_bulk_schema_bytes", parse_size,
          "bytes of SCHEMA frames one bulk upload (format 2) may send (413 past it)",
          "--max-bulk-schema-bytes", "SIZE"),
    Field("max_slab_index_bytes", parse_size,
          "bytes of a slab's index section, and of its statistics section (400 past it; "
          "held in memory while the slab is checked)", "--max-slab-index-bytes", "SIZE"),
    Field("max_slab_batch_bytes", parse_size,
          "largest record batch a slab may carry (400 past it): a shard read decodes the "
          "batches at its edges whole", "--max-slab-batch-bytes", "SIZE"),
    Field("request_head_timeout", parse_duration,
          "a connection must send a whole request head within this long of opening or of "
          "its previous answer (idle and slowloris connections are closed)",
          "--request-head-timeout", "DURATION"),
    Field("send_idle_timeout", parse_duration,
          "a reader that takes nothing of an answer for this long (16 MiB at the most is "
          "sent per wait) is cut off and its download slot freed",
          "--send-idle-timeout", "DURATION"),
    Field("shutdown_timeout", parse_duration,
          "on SIGTERM, how long in-flight requests may take to finish",
          "--shutdown-timeout", "DURATION"),
    Field("long_poll_max", parse_duration,
          "the longest a paged read or task-state request may wait for news (maxWait is "
          "cut to this)", "--long-poll-max", "DURATION"),
    Field("long_poll_waiters", parse_positive_int,
          "requests waiting for news at once before new ones get 503 + Retry-After",
          "--long-poll-waiters", "N"),
    Field("failed_read_delay", parse_duration,
          "a paged read of a failed task answers after this delay (a reader retrying in a "
          "loop cannot spin)", "--failed-read-delay", "DURATION"),
    Field("access_log", parse_bool,
          "log one line per request on the shuffled.access logger (fields in docs/ops.md)",
          "--access-log", "BOOL"),
    Field("log_level", lambda v, n: str(v).upper(), "logging level", "--log-level", "LEVEL"),
    Field("deep_storage", parse_deep_storage_uri,
          "object-store tier s3://BUCKET/PREFIX: sealed tasks are copied there in the "
          "background, encrypted, and reads fall back to it (docs/deep-storage.md); "
          "credentials and endpoint from the standard AWS environment",
          "--deep-storage", "URI"),
    Field("deep_storage_key_file", parse_optional_str,
          "file holding the secret (at least 32 bytes) each task's AES-256-GCM key for the "
          "tier is derived from; required with deep_storage", "--deep-storage-key-file",
          "PATH"),
    Field("deep_storage_concurrency", parse_positive_int,
          "packs copied to the tier at once (reads from the tier get two threads more)",
          "--deep-storage-concurrency", "N"),
    Field("deep_storage_bandwidth", parse_size,
          "bytes per second the offload may send to the tier (0: no limit)",
          "--deep-storage-bandwidth", "SIZE"),
    Field("deep_storage_orphan_seconds", parse_duration,
          "without overlord_url, the sweeper removes a task's prefix in the tier (every "
          "daemon's copy) once its newest object is this old and this daemon does not hold "
          "the task (an orphan: its DELETE never came, or its daemon was lost)",
          "--deep-storage-orphan-seconds", "DURATION"),
)
FIELD_BY_NAME = {f.name: f for f in FIELDS}


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Every daemon setting, validated. Build with :func:`load_settings`."""

    host: str = "127.0.0.1"
    port: int = 8091
    locations: tuple[LocationSettings, ...] = ()
    free_space_reserve: int = 64 * 1024**2
    max_partial_bytes: int = 4 * 1024**3
    fsync: bool = True
    pack_max_bytes: int = 1024**3
    auth_token_file: str | None = None
    auth_token: str | None = field(default=None, repr=False)
    signing_secret_file: str | None = None
    signing_secrets: tuple[bytes, ...] = field(default=(), repr=False)
    task_quota_bytes: int = 0
    task_quota_partials: int = 0
    metrics_require_auth: bool = False
    tls_cert: str | None = None
    tls_key: str | None = None
    expiry_timeout: float = 600.0
    sweep_period: float = 60.0
    overlord_url: str | None = None
    max_age: float = 7 * 86400.0
    max_concurrent_uploads: int = 64
    max_concurrent_downloads: int = 256
    upload_idle_timeout: float = 60.0
    max_lost_marks_bytes: int = 4 << 20
    max_bulk_partials: int = 10_000
    # ~150 MB held at most, whatever max_concurrent_uploads: 64 uploads of max_bulk_partials
    # each held ~960 MB.
    max_held_partials: int = 100_000
    max_bulk_schema_bytes: int = 4 << 20
    max_slab_index_bytes: int = 16 << 20
    max_slab_batch_bytes: int = 64 << 20
    request_head_timeout: float = 30.0
    send_idle_timeout: float = 60.0
    shutdown_timeout: float = 30.0
    long_poll_max: float = 30.0
    long_poll_waiters: int = 1000
    failed_read_delay: float = 0.25
    access_log: bool = True
    log_level: str = "INFO"
    deep_storage: str | None = None
    deep_storage_key_file: str | None = None
    deep_storage_key: bytes = field(default=b"", repr=False)
    deep_storage_concurrency: int = 2
    deep_storage_bandwidth: int = 0
    deep_storage_orphan_seconds: float = 7 * 86400.0

    def validated(self) -> Settings:
        """Check cross-field rules; read the token file. Raises ConfigError naming the setting."""
        if not self.locations:
            raise ConfigError("locations: at least one --location is required", setting="locations")
        paths = [loc.path.resolve() for loc in self.locations]
        if len(set(paths)) != len(paths):
            raise ConfigError("locations: the same path is listed twice", setting="locations")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls_cert: --tls-cert and --tls-key go together", setting="tls_cert")
        for name in ("sweep_period", "request_head_timeout", "send_idle_timeout",
                     "upload_idle_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name}: must be > 0", setting=name)
        if self.max_age < self.expiry_timeout:
            raise ConfigError("max_age: must be >= expiry_timeout", setting="max_age")
        if self.max_held_partials < self.max_bulk_partials:
            raise ConfigError(f"max_held_partials: {self.max_held_partials} is below "
                              f"max_bulk_partials ({self.max_bulk_partials}), so an upload "
                              "of that many could never be taken: raise max_held_partials",
                              setting="max_held_partials")
        if self.deep_storage_orphan_seconds <= 0:
            raise ConfigError("deep_storage_orphan_seconds: must be > 0",
                              setting="deep_storage_orphan_seconds")
        if self.log_level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ConfigError(f"log_level: {self.log_level!r} is not a logging level",
                              setting="log_level")
        token = self.auth_token
        if self.auth_token_file:
            try:
                token = Path(self.auth_token_file).read_text().strip()
            except OSError as exc:
                raise ConfigError(
                    f"auth_token_file: cannot read {self.auth_token_file}: {exc.strerror}",
                    setting="auth_token_file",
                )
            if not token:
                raise ConfigError("auth_token_file: the file is empty", setting="auth_token_file")
        secrets = self.signing_secrets
        if self.signing_secret_file:
            try:
                secrets = read_secrets(Path(self.signing_secret_file).read_text())
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"signing_secret_file: cannot read {self.signing_secret_file}"
                                  f": {getattr(exc, 'strerror', None) or exc}",
                                  setting="signing_secret_file") from None
            if not secrets:
                raise ConfigError("signing_secret_file: the file has no secret",
                                  setting="signing_secret_file")
            if any(len(s) < 16 for s in secrets):
                raise ConfigError("signing_secret_file: a secret is shorter than 16 characters",
                                  setting="signing_secret_file")
        return replace(self, auth_token=token, signing_secrets=secrets,
                       deep_storage_key=self._deep_key())

    def _deep_key(self) -> bytes:
        """The tier's master secret, read from deep_storage_key_file (required with
        deep_storage: data in the tier is always encrypted)."""
        if not self.deep_storage:
            return self.deep_storage_key
        if not self.deep_storage_key_file:
            if len(self.deep_storage_key) >= 32:
                return self.deep_storage_key
            raise ConfigError("deep_storage_key_file: required with deep_storage (data in "
                              "the tier is always encrypted)", setting="deep_storage_key_file")
        try:
            key = Path(self.deep_storage_key_file).read_bytes().strip()
        except OSError as exc:
            raise ConfigError(f"deep_storage_key_file: cannot read "
                              f"{self.deep_storage_key_file}: {exc.strerror}",
                              setting="deep_storage_key_file") from None
        if len(key) < 32:
            raise ConfigError("deep_storage_key_file: the secret is shorter than 32 bytes "
                              "(make one with: head -c 32 /dev/urandom | base64)",
                              setting="deep_storage_key_file")
        return key


def _apply(values: dict[str, Any], source: Mapping[str, Any], origin: str) -> None:
    for key, raw in source.items():
        spec = FIELD_BY_NAME.get(key)
        if spec is None:
            raise ConfigError(f"{origin}: unknown setting {key!r}", setting=key)
        values[key] = spec.parse(raw, key)


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Defaults < TOML ``config_file`` < ``SHUFFLED_*`` environment < ``overrides`` (flags)."""
    values: dict[str, Any] = {}
    if config_file is not None:
        try:
            with open(config_file, "rb") as fh:
                data = tomllib.load(fh)
        except OSError as exc:
            raise ConfigError(f"config: cannot read {config_file}: {exc.strerror}", setting="config")
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config: {config_file} is not valid TOML: {exc}", setting="config")
        _apply(values, data.get("shuffled", data), f"config {config_file}")
    env = os.environ if environ is None else environ
    from_env = {
        name[len(ENV_PREFIX):].lower(): value
        for name, value in env.items()
        if name.startswith(ENV_PREFIX) and name[len(ENV_PREFIX):].lower() in FIELD_BY_NAME
    }
    _apply(values, from_env, "environment")
    _apply(values, {k: v for k, v in (overrides or {}).items() if v is not None}, "flags")
    known = {f.name for f in fields(Settings)}
    return Settings(**{k: v for k, v in values.items() if k in known}).validated()


def reference_markdown() -> str:
    """The configuration reference, generated from FIELDS (docs/configuration.md)."""
    defaults = Settings()
    lines = [
        "# Configuration reference",
        "",
        "Generated from `shuffled/config/__init__.py` (a test keeps this file in sync). Precedence:",
        "defaults < TOML file (`--config`, keys at top level or under `[shuffled]`) <",
        "environment (`SHUFFLED_<NAME>`) < flags. Sizes take `64MiB`/`10GB`; durations take",
        "seconds, `30m`/`2h`/`1h30m`/`7d`, or ISO-8601 (`PT5M`).",
        "",
        "| setting (TOML) | flag | environment | default | meaning |",
        "|---|---|---|---|---|",
    ]
    for spec in FIELDS:
        default = getattr(defaults, spec.name)
        shown = "(none)" if default in (None, ()) else str(default)
        if spec.name == "auth_token":
            shown = "(none)"
        lines.append(
            f"| `{spec.name}` | `{spec.flag} {spec.metavar}` | `{ENV_PREFIX}{spec.name.upper()}` "
            f"| `{shown}` | {spec.help} |"
        )
    return "\n".join(lines) + "\n"
