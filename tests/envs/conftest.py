# the adversarial tasks' own tests (tests/envs/adversarial_tasks/*/tests/) run inside sandboxes, not here
collect_ignore = ["adversarial_tasks", "image_tasks", "published_tasks"]
