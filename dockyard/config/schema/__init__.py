"""The config schema, one module per top-level section."""

from dockyard.config.schema.master import SECTIONS, MasterConfig

__all__ = ["MasterConfig", "SECTIONS"]
