"""Procedural terminal task families (issue 37): generators of everyday shell tasks with oracle
solutions and tests, in the Terminal-Bench layout, and splits that measure generalisation
(splits.py). `dockyard env generate` writes them; docs/agents.md says how to add a family."""
