"""Monarch's configuration: the keys declared once (keys.py), loaded and checked (load.py), frozen (model.py),
handed to a daemon as JSON and compared with a running daemon's (serialize.py)."""

from monarch.config.keys import COMPRESSION_MODES, KEYS, POLICIES, RENAMED_KEYS, RENAMED_POLICIES, VALIDATE_MODES, Key, default_tree
from monarch.config.load import (DEFAULTS_FILE, PRIVATE_PREFIX, base_problem, base_problems, builtin_env,
                                 combine_errors, expand_vars, load_config, read_user)
from monarch.config.model import Config, DatasetConfig, PeerConfig, StagingConfig, TierConfig, WritebackConfig
from monarch.config.serialize import differences, from_json, served, to_json
from monarch.errors import ConfigError
from monarch.sizes import parse_size

__all__ = ["COMPRESSION_MODES", "KEYS", "POLICIES", "RENAMED_KEYS", "RENAMED_POLICIES", "VALIDATE_MODES", "Key", "default_tree",
           "DEFAULTS_FILE", "PRIVATE_PREFIX", "base_problem", "base_problems", "builtin_env", "combine_errors", "expand_vars", "load_config",
           "read_user", "Config", "DatasetConfig", "PeerConfig", "StagingConfig", "TierConfig", "WritebackConfig", "ConfigError",
           "parse_size", "differences", "from_json", "served", "to_json"]
