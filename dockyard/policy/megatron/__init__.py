"""The megatron-core policy backend (policy.backend: megatron)."""
