"""Advantage estimators and policy losses (selected by name from the config)."""
