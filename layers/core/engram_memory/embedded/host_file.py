"""The embedded host's configuration file, ``<data_dir>/host.json``: closed (an unknown key is an
error), written atomically with mode 0600; a missing file means "all defaults"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final

from pydantic import ValidationError

from engram_memory.binding.host_config import HostConfig, describe_validation_error
from engram_memory.embedded.errors import HostConfigError
from engram_memory.embedded.private_files import write_private_file

__all__ = ["HOST_CONFIG_FILE", "host_config_path", "load_host_config", "save_host_config"]

HOST_CONFIG_FILE: Final = "host.json"


def host_config_path(data_dir: Path) -> Path:
    """Where the host configuration of ``data_dir`` lives."""
    return Path(data_dir) / HOST_CONFIG_FILE


def load_host_config(data_dir: Path) -> HostConfig:
    """Read ``<data_dir>/host.json``; a missing file gives the defaults.

    Raises ``HostConfigError`` (with a message for a person) when the file cannot be read, is not
    JSON, or does not describe a valid configuration.
    """
    path = host_config_path(data_dir)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return HostConfig()
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else "unreadable"
        raise HostConfigError(f"cannot read the host configuration {path}: {reason}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise HostConfigError(
            f"the host configuration {path} is not valid JSON"
            f" (line {error.lineno}, column {error.colno}: {error.msg})"
        ) from None
    if not isinstance(data, dict):
        raise HostConfigError(f"the host configuration {path} must hold a JSON object")
    try:
        return HostConfig.model_validate(data)
    except ValidationError as error:
        raise HostConfigError(
            f"the host configuration {path} is invalid: {describe_validation_error(error)}"
        ) from None


def save_host_config(data_dir: Path, config: HostConfig) -> Path:
    """Write ``config`` to ``<data_dir>/host.json`` atomically (mode 0600); returns the path."""
    path = host_config_path(data_dir)
    text = json.dumps(config.model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n"
    write_private_file(path, text.encode("utf-8"), replace=True)
    return path
