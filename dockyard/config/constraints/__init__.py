"""Cross-field rules: every rule that couples two or more fields lives in this package, with the text a
user reads, in the module of the section it checks. Each rule is a function of a schema-valid
MasterConfig that yields Problems; `check` runs them all so one `dockyard validate` shows every
violation.

Where the other kinds of check live: preflight/components.py (what the selected components support)
and preflight/ (what needs the machine: models, datasets, Slurm, outputs). docs/config-reference.md
("Cross-field constraints") lists these rules; tests/config/test_constraints.py triggers each one.
"""

# imported in this order, the order in which `check` runs the rules and the reference lists them
from dockyard.config.constraints import batches, placement, distillation, async_loop, data_plane, off_policy  # isort: skip
from dockyard.config.constraints import precision, generation, outputs, optimizer, containers  # isort: skip
from dockyard.config.constraints.registry import ADVICE, RULES, advise, check

__all__ = ["ADVICE", "RULES", "advise", "check", "batches", "placement", "distillation", "async_loop",
           "data_plane", "off_policy", "precision", "generation", "outputs", "optimizer", "containers"]
