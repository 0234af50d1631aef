"""Named components (see dockyard.registry); each module registers the ones it implements."""
