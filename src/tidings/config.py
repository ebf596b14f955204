"""The configuration file (``tidings serve --config tidings.toml``) and its precedence.

Precedence, strongest first: a command-line flag, a ``TIDINGS_*`` variable, the file, the
built-in default. A bad file is refused at start with its path, the line and the reason
(TOML syntax errors from ``tomllib``; unknown sections or keys and wrong types from here,
with the line of the key). ``tidings init`` writes ``EXAMPLE``.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

EXAMPLE = """\
# tidings.toml: the configuration of `tidings serve --config tidings.toml`.
# Every key is optional. A flag (--port) or a TIDINGS_* variable (TIDINGS_PORT) overrides it.

[database]
# A SQLite file path, or a postgresql:// URL.                       (TIDINGS_DB)
url = "./tidings.db"

[server]
host = "127.0.0.1"          # loopback by default; 0.0.0.0 to listen everywhere  (TIDINGS_HOST)
port = 7860                 #                                                      (TIDINGS_PORT)
# The admin token lives in this file (mode 0600). If the file does not exist yet, the
# token the hub generates on first start is written there instead of printed.
# admin_token_file = "./tidings-admin-token"                         (TIDINGS_ADMIN_TOKEN_FILE)
# Serve /metrics without a token on a separate listener (keep it private).
# metrics_bind = "127.0.0.1:9464"                                    (TIDINGS_METRICS_BIND)

[log]
level = "info"              # debug, info, warning, error                          (TIDINGS_LOG_LEVEL)
format = "auto"             # auto (JSON unless a terminal), json, console         (TIDINGS_LOG_FORMAT)

[delivery]
scan_interval_s = 30        # how often the recovery scan looks for unrouted posts (TIDINGS_SCAN_INTERVAL_S)
keepalive_s = 15            # SSE keep-alive comment when a stream was quiet       (TIDINGS_KEEPALIVE_S)

[wake]
coalesce_ms = 5000          # wakes of one agent within this window are coalesced  (TIDINGS_WAKE_COALESCE_MS)
threads = 2                 # wake commands/webhooks run on this many threads     (TIDINGS_WAKE_THREADS)

[limits]
max_body_bytes = 1048576    # larger request bodies are refused with 413           (TIDINGS_MAX_BODY_BYTES)
"""


class ConfigError(Exception):
    """A bad configuration: the message names the file, the line and the reason."""


@dataclass
class Settings:
    db: str = "./tidings.db"
    host: str = "127.0.0.1"
    port: int = 7860
    admin_token_file: str | None = None
    metrics_bind: str | None = None
    log_level: str = "info"
    log_format: str = "auto"
    scan_interval_s: float = 30.0
    keepalive_s: float = 15.0
    wake_coalesce_ms: int = 5000
    wake_threads: int = 2
    max_body_bytes: int = 1024 * 1024
    origin: dict[str, str] = field(default_factory=dict)  # setting -> "default"/"file"/"env"/"flag"

    def delivery_overrides(self) -> dict[str, Any]:
        return {
            "scan_interval_ms": int(self.scan_interval_s * 1000),
            "keepalive_s": float(self.keepalive_s),
            "wake_coalesce_ms": int(self.wake_coalesce_ms),
            "wake_threads": int(self.wake_threads),
        }


# (section, key) -> (setting, type, environment variable)
KEYS: dict[tuple[str, str], tuple[str, type, str]] = {
    ("database", "url"): ("db", str, "TIDINGS_DB"),
    ("server", "host"): ("host", str, "TIDINGS_HOST"),
    ("server", "port"): ("port", int, "TIDINGS_PORT"),
    ("server", "admin_token_file"): ("admin_token_file", str, "TIDINGS_ADMIN_TOKEN_FILE"),
    ("server", "metrics_bind"): ("metrics_bind", str, "TIDINGS_METRICS_BIND"),
    ("log", "level"): ("log_level", str, "TIDINGS_LOG_LEVEL"),
    ("log", "format"): ("log_format", str, "TIDINGS_LOG_FORMAT"),
    ("delivery", "scan_interval_s"): ("scan_interval_s", float, "TIDINGS_SCAN_INTERVAL_S"),
    ("delivery", "keepalive_s"): ("keepalive_s", float, "TIDINGS_KEEPALIVE_S"),
    ("wake", "coalesce_ms"): ("wake_coalesce_ms", int, "TIDINGS_WAKE_COALESCE_MS"),
    ("wake", "threads"): ("wake_threads", int, "TIDINGS_WAKE_THREADS"),
    ("limits", "max_body_bytes"): ("max_body_bytes", int, "TIDINGS_MAX_BODY_BYTES"),
}
CHOICES = {"log_level": ("debug", "info", "warning", "error"), "log_format": ("auto", "json", "console")}
POSITIVE = {"port", "scan_interval_s", "keepalive_s", "wake_threads", "max_body_bytes"}


def _line_of(text: str, section: str, key: str | None) -> int | None:
    """The line of ``[section]`` (or of ``key`` inside it) in ``text``, 1-based."""
    current = None
    for number, line in enumerate(text.splitlines(), 1):
        header = re.match(r"\s*\[([^\]]+)\]", line)
        if header:
            current = header.group(1).strip()
            if key is None and current == section:
                return number
            continue
        if key is not None and current == section and re.match(rf"\s*{re.escape(key)}\s*=", line):
            return number
    return None


def _check(setting: str, kind: type, value: Any, where: str) -> Any:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise ConfigError(f"{where}: must be {'an integer' if kind is int else 'a number' if kind is float else 'a string'}")
    if setting in CHOICES and value.lower() not in CHOICES[setting]:
        raise ConfigError(f"{where}: must be one of {', '.join(CHOICES[setting])}")
    if setting in POSITIVE and value <= 0:
        raise ConfigError(f"{where}: must be positive")
    if setting == "port" and value > 65535:
        raise ConfigError(f"{where}: must be at most 65535")
    return value.lower() if setting in CHOICES else value


def load_file(path: str | Path) -> dict[str, Any]:
    """The settings ``path`` sets; ``ConfigError`` with line and reason when it is bad."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    out: dict[str, Any] = {}
    sections = {s for s, _ in KEYS}
    for section, values in doc.items():
        if section not in sections or not isinstance(values, dict):
            line = _line_of(text, section, None)
            raise ConfigError(f"{path}, line {line}: unknown section [{section}] "
                              f"(known: {', '.join(sorted(sections))})")
        for key, value in values.items():
            line = _line_of(text, section, key)
            where = f"{path}, line {line}: [{section}] {key}"
            if (section, key) not in KEYS:
                known = sorted(k for s, k in KEYS if s == section)
                raise ConfigError(f"{where}: unknown key (known in [{section}]: {', '.join(known)})")
            setting, kind, _ = KEYS[(section, key)]
            out[setting] = _check(setting, kind, value, where)
    return out


def resolve(config_path: str | None, flags: dict[str, Any], env: dict[str, str] | None = None) -> Settings:
    """Defaults, then the file, then ``TIDINGS_*``, then flags (those not None)."""
    env = os.environ if env is None else env
    settings = Settings()
    origin = {f.name: "default" for f in fields(Settings) if f.name != "origin"}
    if config_path:
        for name, value in load_file(config_path).items():
            setattr(settings, name, value)
            origin[name] = "file"
    for (_section, _key), (name, kind, var) in KEYS.items():
        raw = env.get(var)
        if raw is None or raw == "":
            continue
        try:
            value = kind(raw) if kind is not str else raw
        except ValueError:
            raise ConfigError(f"{var}={raw!r}: must be {'an integer' if kind is int else 'a number'}") from None
        setattr(settings, name, _check(name, kind, value, var))
        origin[name] = "env"
    for name, value in flags.items():
        if value is not None:
            setattr(settings, name, value)
            origin[name] = "flag"
    settings.origin = origin
    return settings


def write_example(path: str | Path) -> Path:
    """Write ``EXAMPLE`` to ``path``; refuses to overwrite a file."""
    path = Path(path)
    if path.exists():
        raise ConfigError(f"{path} exists already; not overwritten")
    path.write_text(EXAMPLE, encoding="utf-8")
    return path
