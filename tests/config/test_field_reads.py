"""The record behind the suite's "every field is read" check (dockyard/config/field_reads.py): reads by
the package's code count by their exact dotted path, reads by a test or by the config's own checking
do not, and a field nobody read is named."""

import subprocess
import sys

from dockyard.config.field_reads import schema_paths
from dockyard.config.schema import MasterConfig
from tests.conftest import REPO
from tests.schema_reads import unread

READER = f"""
from dockyard.config import load_config
cfg = load_config("grpo_tiny.yaml", ["models_dir=models"]).config
as_package = compile("cfg.cluster.teacher.tasks_per_node", {str(REPO / 'dockyard' / 'reader.py')!r}, "eval")
as_checker = compile("cfg.cluster.rollout.tasks_per_node", {str(REPO / 'dockyard' / 'config' / 'constraints' / 'x.py')!r}, "eval")
eval(as_package); eval(as_checker)
cfg.logger.log_level   # a read by this script (a test), not by the package
"""


def test_reads_count_by_dotted_path_and_only_the_packages(tmp_path):
    subprocess.run([sys.executable, "-c", READER], check=True, cwd=REPO, capture_output=True,
                   env={"DOCKYARD_FIELD_READS": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    reads = {line for file in tmp_path.glob("reads-*.txt") for line in file.read_text().split()}
    assert "cluster.teacher.tasks_per_node" in reads
    assert "cluster.rollout.tasks_per_node" not in reads      # same leaf name, read only by a checker
    assert "logger.log_level" not in reads


def test_a_field_nobody_read_is_named():
    everything = set(schema_paths(MasterConfig))
    assert unread(everything) == []
    assert unread(everything - {"cluster.teacher.tasks_per_node"}) == ["cluster.teacher.tasks_per_node"]
