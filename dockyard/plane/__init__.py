"""The data plane (docs/data-plane.md): rollout-worker jobs and the trainer exchange prompts,
trajectories and weight versions through a Redis / Valkey broker."""
