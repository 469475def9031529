"""Typed daemon settings, from defaults < TOML file < environment < command-line flags.

One table (``FIELDS``) describes every setting once; the argparse flags, the
``SHUFFLED_*`` environment names, the TOML keys and the generated configuration reference
(docs/configuration.md) all come from it, so they cannot drift apart.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import KW_ONLY, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from shuffled.errors import ConfigError
from shuffled.tokens import read_secrets

ENV_PREFIX = "SHUFFLED_"

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "ki": 1024, "kib": 1024, "mi": 1024**2, "mib": 1024**2, "gi": 1024**3, "gib": 1024**3,
    "ti": 1024**4, "tib": 1024**4,
}
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")
_DURATION_RE = re.compile(
    r"P(?:(?P<w>\d+(?:\.\d+)?)W)?(?:(?P<d>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?",
    re.IGNORECASE,
)


def parse_size(value: Any, name: str) -> int:
    """Bytes from ``1048576``, ``64MiB``, ``10GB`` (SI and IEC units)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ConfigError(f"{name}: size {value} is negative", setting=name)
        return value
    match = _SIZE_RE.fullmatch(str(value))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _SIZE_UNITS:
        raise ConfigError(f"{name}: {value!r} is not a size like 1048576, 64MiB or 10GB", setting=name)
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def parse_duration(value: Any, name: str) -> float:
    """Seconds from a number of seconds or an ISO-8601 duration (``PT5M``, ``P1D``)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        text = str(value).strip()
        try:
            seconds = float(text)
        except ValueError:
            match = _DURATION_RE.fullmatch(text)
            if not match or text.upper() in ("P", "PT") or text.upper().endswith("T"):
                raise ConfigError(
                    f"{name}: {value!r} is not a duration in seconds or ISO-8601 (PT5M)",
                    setting=name,
                )
            parts = {k: float(v) for k, v in match.groupdict().items() if v}
            seconds = (
                parts.get("w", 0) * 604800 + parts.get("d", 0) * 86400
                + parts.get("h", 0) * 3600 + parts.get("m", 0) * 60 + parts.get("s", 0)
            )
    if seconds < 0 or math.isnan(seconds) or math.isinf(seconds):
        raise ConfigError(f"{name}: duration {value!r} must be finite and >= 0", setting=name)
    return seconds


def parse_bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}: {value!r} is not a boolean (true/false)", setting=name)


@dataclass(frozen=True)
class LocationSettings:
    """One storage location: a directory, its size cap and the free space to leave on its disk."""

    path: Path
    _: KW_ONLY
    max_bytes: int | None = None
    reserve_bytes: int | None = None  # None: the daemon-wide free_space_reserve

    @classmethod
    def parse(cls, value: Any, name: str = "location") -> LocationSettings:
        """``PATH`` or ``PATH:MAX_BYTES`` (a string) or ``{path, max_bytes, reserve_bytes}``."""
        if isinstance(value, LocationSettings):
            return value
        if isinstance(value, Mapping):
            unknown = set(value) - {"path", "max_bytes", "reserve_bytes"}
            if unknown or "path" not in value:
                raise ConfigError(
                    f"{name}: a location table takes path, max_bytes, reserve_bytes "
                    f"(got {sorted(value)})",
                    setting=name,
                )
            max_b = value.get("max_bytes")
            res_b = value.get("reserve_bytes")
            return cls(
                Path(str(value["path"])),
                max_bytes=parse_size(max_b, f"{name}.max_bytes") if max_b is not None else None,
                reserve_bytes=(parse_size(res_b, f"{name}.reserve_bytes")
                               if res_b is not None else None),
            )
        text = str(value)
        path, sep, size = text.rpartition(":")
        if sep and path and _SIZE_RE.fullmatch(size):
            return cls(Path(path), max_bytes=parse_size(size, name))
        if not text:
            raise ConfigError(f"{name}: empty location path", setting=name)
        return cls(Path(text))


def _parse_locations(value: Any, name: str) -> tuple[LocationSettings, ...]:
    items = value if isinstance(value, (list, tuple)) else [
        v for v in str(value).split(",") if v.strip()
    ]
    return tuple(LocationSettings.parse(v, f"{name}[{i}]") for i, v in enumerate(items))


def _opt_str(value: Any, name: str) -> str | None:
    text = str(value).strip() if value is not None else ""
    return text or None


def _deep_storage_uri(value: Any, name: str) -> str | None:
    text = _opt_str(value, name)
    if text is None:
        return None
    bucket = text[len("s3://"):].split("/", 1)[0] if text.startswith("s3://") else ""
    if not bucket:
        raise ConfigError(f"{name}: {text!r} is not s3://BUCKET[/PREFIX]", setting=name)
    return text.rstrip("/")


def _port(value: Any, name: str) -> int:
    try:
        port = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: {value!r} is not a port number", setting=name)
    if not 0 <= port <= 65535:
        raise ConfigError(f"{name}: {port} is outside 0-65535", setting=name)
    return port


def _int_at_least(value: Any, name: str, low: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: {value!r} is not an integer", setting=name)
    if number < low:
        raise ConfigError(f"{name}: {number} must be >= {low}", setting=name)
    return number


def _positive_int(value: Any, name: str) -> int:
    return _int_at_least(value, name, 1)


def _nonnegative_int(value: Any, name: str) -> int:
    return _int_at_least(value, name, 0)


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
    Field("port", _port, "TCP port (0 picks a free one)", "--port", "PORT"),
    Field("locations", _parse_locations,
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
    Field("auth_token_file", _opt_str,
          "file holding the bearer token every request must carry, except /status/health "
          "and (unless metrics_require_auth) /metrics; env SHUFFLED_AUTH_TOKEN gives the token",
          "--auth-token-file", "PATH"),
    Field("auth_token", _opt_str, "the bearer token itself (prefer the file or the env var)",
          "--auth-token", "TOKEN"),
    Field("signing_secret_file", _opt_str,
          "file of secrets (one per line; the first signs, all verify: add the new one first "
          "to rotate) shared by the daemons and the ingestion drivers, which mint per-task "
          "read/write/admin tokens with it (docs/security.md); auth_token stays the operator's",
          "--signing-secret-file", "PATH"),
    Field("task_quota_bytes", parse_size,
          "most bytes one supervisor task may hold on this daemon (0: no limit; 507 above)",
          "--task-quota-bytes", "SIZE"),
    Field("task_quota_partials", _nonnegative_int,
          "most partial segments one supervisor task may hold on this daemon (0: no limit)",
          "--task-quota-partials", "N"),
    Field("metrics_require_auth", parse_bool,
          "whether /metrics needs the token too", "--metrics-require-auth", "BOOL"),
    Field("tls_cert", _opt_str, "PEM certificate chain: serve HTTPS", "--tls-cert", "PATH"),
    Field("tls_key", _opt_str, "PEM private key for --tls-cert", "--tls-key", "PATH"),
    Field("expiry_timeout", parse_duration,
          "a supervisor task's data expires this long after its last PUT/GET",
          "--expiry-timeout", "DURATION"),
    Field("sweep_period", parse_duration, "how often the expiry sweeper runs",
          "--sweep-period", "DURATION"),
    Field("overlord_url", _opt_str,
          "Druid overlord base URL asked whether an expired task still runs",
          "--overlord-url", "URL"),
    Field("max_age", parse_duration,
          "data is deleted past this age since last access even when the overlord is "
          "unreachable", "--max-age", "DURATION"),
    Field("max_concurrent_uploads", _positive_int,
          "uploads in flight before new ones get 503 + Retry-After",
          "--max-concurrent-uploads", "N"),
    Field("max_concurrent_downloads", _positive_int,
          "downloads in flight before new ones get 503 + Retry-After",
          "--max-concurrent-downloads", "N"),
    Field("upload_idle_timeout", parse_duration,
          "an upload whose body sends nothing for this long is abandoned (408) and its "
          "slot freed", "--upload-idle-timeout", "DURATION"),
    Field("shutdown_timeout", parse_duration,
          "on SIGTERM, how long in-flight requests may take to finish",
          "--shutdown-timeout", "DURATION"),
    Field("long_poll_max", parse_duration,
          "the longest a paged read or task-state request may wait for news (maxWait is "
          "cut to this)", "--long-poll-max", "DURATION"),
    Field("long_poll_waiters", _positive_int,
          "requests waiting for news at once before new ones get 503 + Retry-After",
          "--long-poll-waiters", "N"),
    Field("failed_read_delay", parse_duration,
          "a paged read of a failed task answers after this delay (a reader retrying in a "
          "loop cannot spin)", "--failed-read-delay", "DURATION"),
    Field("access_log", parse_bool,
          "log one line per request on the shuffled.access logger (fields in docs/ops.md)",
          "--access-log", "BOOL"),
    Field("log_level", lambda v, n: str(v).upper(), "logging level", "--log-level", "LEVEL"),
    Field("deep_storage", _deep_storage_uri,
          "object-store tier s3://BUCKET/PREFIX: sealed tasks are copied there in the "
          "background, encrypted, and reads fall back to it (docs/deep-storage.md); "
          "credentials and endpoint from the standard AWS environment",
          "--deep-storage", "URI"),
    Field("deep_storage_key_file", _opt_str,
          "file holding the secret (at least 32 bytes) each task's AES-256-GCM key for the "
          "tier is derived from; required with deep_storage", "--deep-storage-key-file",
          "PATH"),
    Field("deep_storage_concurrency", _positive_int,
          "packs copied to the tier at once (reads from the tier get two threads more)",
          "--deep-storage-concurrency", "N"),
    Field("deep_storage_bandwidth", parse_size,
          "bytes per second the offload may send to the tier (0: no limit)",
          "--deep-storage-bandwidth", "SIZE"),
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

    def validated(self) -> Settings:
        """Check cross-field rules; read the token file. Raises ConfigError naming the setting."""
        if not self.locations:
            raise ConfigError("locations: at least one --location is required", setting="locations")
        paths = [loc.path.resolve() for loc in self.locations]
        if len(set(paths)) != len(paths):
            raise ConfigError("locations: the same path is listed twice", setting="locations")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls_cert: --tls-cert and --tls-key go together", setting="tls_cert")
        if self.sweep_period <= 0:
            raise ConfigError("sweep_period: must be > 0", setting="sweep_period")
        if self.max_age < self.expiry_timeout:
            raise ConfigError("max_age: must be >= expiry_timeout", setting="max_age")
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
        "Generated from `shuffled/config.py` (a test keeps this file in sync). Precedence:",
        "defaults < TOML file (`--config`, keys at top level or under `[shuffled]`) <",
        "environment (`SHUFFLED_<NAME>`) < flags. Sizes take `64MiB`/`10GB`; durations take",
        "seconds or ISO-8601 (`PT5M`).",
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
