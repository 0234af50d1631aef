"""The config schema, one module per top-level section."""

from dockyard.config.schema.master import SECTIONS, MasterConfig

__all__ = ["MasterConfig", "SECTIONS"]


def _record_field_reads_if_asked() -> None:
    import os

    from dockyard.config import field_reads
    from dockyard.config.fields import OpenSection, Section

    if os.environ.get(field_reads.ENV):
        field_reads.install([Section, OpenSection], MasterConfig)


_record_field_reads_if_asked()
