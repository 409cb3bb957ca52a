"""Loading settings: `load_settings` from every source, and `settings_env` to hand
them to a new process.

Sources, strongest first: explicit arguments, `DELAYSERVICE_*` environment variables,
the TOML file given with `--config` (or named by `DELAYSERVICE_CONFIG`), then defaults.
The daemon, the CLI and `DelayProducer` all load through `load_settings`, so a producer
beside a daemon sees the same levels and topics. Unknown keys are errors in every
source, because a misspelt setting silently falling back to a default is the kind of
mistake that only shows up as a late message in production. Any value in any source
gives valid settings or one `ConfigError` naming the setting, never another exception.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from delayservice.errors import ConfigError
from delayservice.settings import ENV_PREFIX, Settings

# Variables that belong to the test harness and the CLI, not to the daemon: these
# prefixes, and these exact names (so that DELAYSERVICE_CONFIGS is still an error).
_NOT_SETTINGS = ("DELAYSERVICE_TEST_", "DELAYSERVICE_AUDIT_", "DELAYSERVICE_SIM_")
CONFIG_VARIABLE = "DELAYSERVICE_CONFIG"
"""Names the TOML file, for the daemon and the producer alike (`load_settings`)."""
_NOT_SETTINGS_EXACT = frozenset(
    {CONFIG_VARIABLE, "DELAYSERVICE_CHECK_URL", "DELAYSERVICE_PURE_PYTHON"}  # the last: setup.py
)


def _one_line(text: str) -> str:
    """An error is one line on stderr whatever the value it quotes."""
    return " ".join(text.split())


def _unknown_env() -> list[str]:
    known = {f"{ENV_PREFIX}{name}".upper() for name in Settings.model_fields}
    return sorted(
        key
        for key in os.environ
        if key.upper().startswith(ENV_PREFIX)
        and key.upper() not in known
        and key.upper() not in _NOT_SETTINGS_EXACT
        and not key.upper().startswith(_NOT_SETTINGS)
    )


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError as exc:
        raise ConfigError("--config", f"{path} does not exist") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError("--config", f"{path} is not valid TOML: {exc}") from exc
    except OSError as exc:
        raise ConfigError("--config", f"{path} cannot be read: {exc.strerror or exc}") from exc


def config_file_named(config_file: Path | str | None = None) -> Path | None:
    """The settings file: the one given, else the one `DELAYSERVICE_CONFIG` names (as the
    CLI's `--config` falls back to it), else none."""
    if config_file is None or config_file == "":
        config_file = os.environ.get(CONFIG_VARIABLE) or None
    return Path(config_file) if config_file is not None else None


def load_settings(config_file: Path | str | None = None, **overrides: Any) -> Settings:
    """Build settings from all sources, turning any problem into one `ConfigError`.

    Without `config_file`, the file `DELAYSERVICE_CONFIG` names is read, so every
    caller (daemon, CLI, producer) sees the settings the deployment set."""
    unknown = _unknown_env()
    if unknown:
        raise ConfigError(unknown[0], "unknown setting (check the spelling)")
    path = config_file_named(config_file)
    file_values = _read_toml(path) if path is not None else {}
    env_names = {k.upper() for k in os.environ}
    # The file is weaker than the environment: pass only what the environment leaves unset.
    init = {
        key: value
        for key, value in file_values.items()
        if f"{ENV_PREFIX}{key}".upper() not in env_names
    }
    init.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return Settings(**init)
    except ConfigError:
        raise
    except ValidationError as exc:
        error = exc.errors()[0]
        name = ".".join(str(part) for part in error["loc"]) or "settings"
        cause = error.get("ctx", {}).get("error")
        message = (
            "unknown setting (check the spelling)"
            if error["type"] == "extra_forbidden"
            else str(cause or error["msg"])
        )
        raise ConfigError(_one_line(name), _one_line(message)) from None


DEPRECATED = frozenset({"scheduler"})
"""Settings that warn when set: passed on to a new process only when set here, so that
worker processes and test daemons do not each warn about a default."""


def settings_env(settings: Settings, **changes: Any) -> dict[str, str]:
    """This process's environment, with every `DELAYSERVICE_*` variable replaced by ones
    that make a new process load exactly `settings` (updated by `changes`): how tests,
    benchmarks and supervisors start daemons as subprocesses."""
    quiet = {name for name in DEPRECATED if name not in settings.model_fields_set}
    values = {**settings.model_dump(exclude=quiet), **changes}
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(ENV_PREFIX)}
    for name, value in values.items():
        if value is None:
            continue  # unset: the default follows from the others (commit_interval_s)
        text = json.dumps(value) if isinstance(value, dict) else str(value)
        env[f"{ENV_PREFIX}{name.upper()}"] = text
    return env
