"""One typed config for `turnrl train` / `turnrl eval`: YAML files plus ``key=value`` overrides.

Every field is documented in :mod:`~turnrl.config.schema` and nowhere else; ``turnrl train --help-config [KEY]``
prints these docs. :mod:`~turnrl.config.load` reads and writes configs, :mod:`~turnrl.config.names` suggests keys,
:mod:`~turnrl.config.resume` decides what a resumed run may change.
Validation happens before any work: an unknown key or a bad value (a non-finite float, an ``algo.prm``
that does not import, overlapping training and held-out seeds, ...) stops with a message that names the
key and the fix. For an unknown key that is a typo, the fix is the closest valid key; for another
framework's name for a knob (TRL's ``learning_rate``, verl's ``actor_rollout_ref.rollout.n``), it is the
turnrl key from :data:`ALIASES` (a suggestion only: the other name is never accepted).

A resumed run continues with its own ``config.yaml``; :func:`resume_config` applies the changes that
resume allows (:data:`RESUMABLE`) and refuses the rest, and :func:`record_changes` writes them to the run.
"""

from turnrl.config.load import apply_overrides, config_help, load_config, write_config
from turnrl.config.names import ALIASES, VALUE_ALIASES, Alias
from turnrl.config.resume import FIXED_ON_RESUME, RESUMABLE, ConfigChange, may_change_on_resume, record_changes, resume_config
from turnrl.config.schema import (
    AlgoConfig,
    Config,
    ConfigError,
    EnvConfig,
    EvalConfig,
    LogConfig,
    ModelConfig,
    MonitorConfig,
    RolloutConfig,
    TrainConfig,
    valid_keys,
)

__all__ = [
    "ALIASES", "FIXED_ON_RESUME", "RESUMABLE", "VALUE_ALIASES", "Alias", "AlgoConfig", "Config", "ConfigChange",
    "ConfigError", "EnvConfig", "EvalConfig", "LogConfig", "ModelConfig", "MonitorConfig", "RolloutConfig",
    "TrainConfig", "apply_overrides", "config_help", "load_config", "may_change_on_resume", "record_changes", "resume_config",
    "valid_keys", "write_config",
]
