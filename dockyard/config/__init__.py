"""Config loading and validation: see loader.load_config."""

from dockyard.config.errors import ConfigError, Problem
from dockyard.config.loader import LoadedConfig, load_config
from dockyard.config.schema import MasterConfig

__all__ = ["ConfigError", "LoadedConfig", "MasterConfig", "Problem", "load_config"]
