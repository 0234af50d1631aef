"""One registry for every kind of named component."""

import pytest

from dockyard import registry


def test_builtin_catalog_covers_every_kind():
    for kind in registry.KINDS:
        assert registry.names(kind), f"no {kind} in the catalog"


def test_register_and_build_a_user_component():
    @registry.register("reward", "test_constant_reward")
    class Constant:
        """Always the same reward."""

        def __init__(self, value):
            self.value = value

        def __call__(self, completion, label):
            return self.value

    entry = registry.get("reward", "test_constant_reward")
    assert entry.available and entry.doc == "Always the same reward."
    assert registry.build("reward", "test_constant_reward", value=0.5)("x", "y") == 0.5


def test_registering_a_second_factory_under_one_name_fails():
    @registry.register("loss", "test_twice")
    def first():
        """One."""

    with pytest.raises(ValueError, match="registered twice"):
        @registry.register("loss", "test_twice")
        def second():
            """Two."""


def test_declared_component_is_listed_but_cannot_be_built(monkeypatch):
    # every built-in entry is implemented now (osworld was the last): the mechanism is checked on one of its own
    monkeypatch.setitem(registry._entries, ("environment", "not_built_xyz"),
                        registry.Entry("environment", "not_built_xyz", "an environment still to come"))
    entry = registry.get("environment", "not_built_xyz")
    assert not entry.available and "not_built_xyz" in registry.names("environment")
    with pytest.raises(registry.ComponentUnavailableError, match="not implemented in this version"):
        registry.build("environment", "not_built_xyz")
    assert registry.get("environment", "osworld").available
    assert registry.get("policy_backend", "megatron").available and registry.get("policy_backend", "jax").available


def test_unknown_name_and_kind():
    with pytest.raises(registry.UnknownComponentError, match="unknown reward .nope_reward_xyz.; registered: .*exact_match"):
        registry.get("reward", "nope_reward_xyz")
    with pytest.raises(ValueError, match="unknown component kind 'widget'"):
        registry.register("widget", "x")
