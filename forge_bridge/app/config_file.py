"""A trainer config from a file (`forge-bridge train --config run.yaml`, or .json): the same frozen
dataclasses the flags fill, validated the same way, each nested part a section of the file:

    rollout: {group_size: 4}
    optimizer: {lr: 1.0e-4}
    run: {name: mine, out_dir: runs/mine, report_to: [tensorboard, wandb]}
    gamma: 0.9

Flags given on the command line override the file (`merged`); a key the config does not have is
an error naming it and the keys that are allowed there."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from forge_bridge.core.errors import InvalidArgument


def read_file(path: str | Path) -> dict[str, Any]:
    """The mapping a .yaml, .yml or .json file holds."""
    path = Path(path)
    if not path.is_file():
        raise InvalidArgument(f"--config: no such file {str(path)!r}")
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml  # PyYAML: a core dependency

        try:
            data = yaml.load(text, Loader=_loader(yaml))
        except yaml.YAMLError as exc:
            raise InvalidArgument(f"--config {path}: not valid YAML ({exc})") from None
    elif path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"--config {path}: not valid JSON ({exc})") from None
    else:
        raise InvalidArgument(f"--config {path}: expected a .yaml, .yml or .json file")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InvalidArgument(f"--config {path}: expected a mapping of settings, got {type(data).__name__}")
    return data


def config_settings(cls: type, data: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`data` checked against the fields of the config class `cls` (a nested part a section, as
    `to_dict` writes it): an unknown key is an `InvalidArgument` naming it and the allowed ones."""
    from forge_bridge.trainer.config import PARTS

    fields = {f.name for f in dataclasses.fields(cls)}
    for key, value in data.items():
        if key not in fields:
            raise InvalidArgument(f"{where}: unknown key {key!r}; {cls.__name__} takes {', '.join(sorted(fields))}")
        if key in PARTS and value is not None:
            if not isinstance(value, Mapping):
                raise InvalidArgument(f"{where}: {key} is a section of settings ({', '.join(_fields(PARTS[key]))}), "
                                      f"got {value!r}")
            config_settings(PARTS[key], value, f"{where}: {key}")
    return dict(data)


def merged(cls: type, path: str | None, flags: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of `cls` from the file at `path` (None: no file), with the flags
    (their flat names, `FLAT_NAMES`, or the config's own fields) applied on top."""
    settings = config_settings(cls, read_file(path), f"--config {path}") if path else {}
    return {**settings, **flags}


def _loader(yaml: Any) -> type:
    """YAML's safe loader, reading `1e-4` as a number as YAML 1.2 does (1.1 wants `1.0e-4`)."""
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9_]*)?[eE][-+]?[0-9]+$"),
                                 list("-+0123456789"))
    return Loader


def _fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


__all__ = ["config_settings", "merged", "read_file"]
