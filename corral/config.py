"""Stack configuration, re-exported for trainers (the loader lives in `workers.config`)."""

from workers.config import ConfigError, StackConfig, find_config, load_config

__all__ = ["ConfigError", "StackConfig", "find_config", "load_config"]
