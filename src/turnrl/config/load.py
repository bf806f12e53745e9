"""Reading a config: YAML files plus ``key=value`` overrides, validated into a :class:`Config`; writing it back; help."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from turnrl.config.names import _closest, _value_hint
from turnrl.config.schema import Config, ConfigError, _fields, valid_keys


def _set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"'{key}': '{p}' is a value, not a section.{_closest(key)}")
        node = nxt
    node[parts[-1]] = value


def _parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise ConfigError(f"override '{item}' is not key=value (example: train.lr=1e-5)")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key.startswith("env.kwargs.") and key not in valid_keys():
        raise ConfigError(f"unknown config key '{key}'.{_closest(key)} Run `turnrl train --help-config` for all keys.")
    try:
        return key, yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"'{key}': {raw!r} is not a YAML value ({_yaml_problem(e)}); quote a string, write a list "
                          "as [a, b]") from None


def _yaml_problem(err: yaml.YAMLError) -> str:
    """One line for a YAML error: what is wrong, and where."""
    mark = getattr(err, "problem_mark", None)
    if isinstance(err, yaml.MarkedYAMLError) and mark is not None:
        return f"{err.problem} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(err).split())


def _read_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping in a YAML config file; every way the file can be unusable is one :class:`ConfigError` line."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist; shipped recipes are in configs/ (e.g. -c configs/default.yaml)")
    try:
        tree = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (UnicodeDecodeError, OSError) as e:  # a binary file, a directory, no permission
        what = "is not a text file" if isinstance(e, UnicodeDecodeError) else f"cannot be read ({e.strerror.lower()})"
        raise ConfigError(f"config file {path} {what}; pass a YAML file (e.g. -c configs/default.yaml)") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {_yaml_problem(e)}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections (e.g. 'train: {{lr: 1.0e-5}}'), "
                          f"got {type(tree).__name__}")
    return tree


def _format_error(e: dict[str, Any]) -> str:
    key = ".".join(str(p) for p in e["loc"] if not isinstance(p, int))  # train.betas, not train.betas.0
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] == "extra_forbidden":
        return f"unknown config key '{key}'.{_closest(key)}"
    if not key:
        return msg
    if e["type"] == "value_error":  # our validators' messages name the value and the fix
        return f"'{key}': {msg}"
    return f"'{key}' = {e.get('input')!r}: {msg}.{_value_hint(key, e.get('input'))}"


def _validate(tree: dict[str, Any]) -> Config:
    try:
        return Config.model_validate(tree)
    except ValidationError as e:
        raise ConfigError("invalid config: " + "; ".join(_format_error(x) for x in e.errors())) from None


def _with_overrides(tree: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    for item in overrides:
        key, value = _parse_override(item)
        _set_dotted(tree, key, value)
    return tree


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Build the config from an optional YAML file and ``key=value`` overrides (later wins)."""
    return _validate(_with_overrides(_read_yaml(path) if path is not None else {}, overrides))


def apply_overrides(cfg: Config, overrides: list[str] | tuple[str, ...]) -> Config:
    """A new config: ``cfg`` with ``key=value`` overrides applied and validated as a whole (``cfg`` is unchanged)."""
    return _validate(_with_overrides(cfg.model_dump(mode="json"), overrides))


def write_config(cfg: Config, path: str | Path) -> None:
    """Write ``cfg`` as YAML that :func:`load_config` reads back equal (replaced atomically: a crash leaves the old file)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    tmp.replace(path)


def config_help(cfg: Config | None = None, key: str = "") -> str:
    """Each key (all, one, or one section's: ``key``) with its value in ``cfg`` (default: the built-in defaults),
    the default where the value differs, and its meaning."""
    cfg = cfg if cfg is not None else Config()
    lines = []
    for dotted, section, name, field in _fields():
        if key and key not in (dotted, section):
            continue
        value, default = getattr(getattr(cfg, section), name), field.get_default(call_default_factory=True)
        differs = f"  (default {default!r})" if value != default else ""
        lines.append(f"  {dotted} = {value!r}{differs}\n      {field.description}")
    if not lines:
        raise ConfigError(f"--help-config {key}: no such key or section.{_closest(key)} Run `turnrl train --help-config` "
                          "for all keys.")
    return "\n".join(lines)
