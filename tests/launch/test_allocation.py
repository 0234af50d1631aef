"""Reading the allocation from Slurm's variables; node lists expanded by the real scontrol."""

import pytest

from dockyard.launch.allocation import Allocation, AllocationError

HET_ENV = {"SLURM_JOB_ID": "40", "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
           "SLURMD_NODENAME": "node2", "SLURM_HET_SIZE": "2", "SLURM_JOB_NODELIST": "node[1-2]",
           "SLURM_JOB_NODELIST_HET_GROUP_0": "node[1-2]", "SLURM_JOB_NODELIST_HET_GROUP_1": "node[3-4],gpu07"}


def test_first_run_and_requeued_run_are_different_incarnations():
    first = Allocation.from_env(HET_ENV)
    assert (first.job_id, first.rank, first.world_size, first.node, first.restart_count) == ("40", 1, 2, "node2", 0)
    again = Allocation.from_env(dict(HET_ENV, SLURM_RESTART_COUNT="2"))
    assert first.incarnation == "40.0" and again.incarnation == "40.2"


def test_outside_a_job_step_the_missing_variable_is_named():
    with pytest.raises(AllocationError, match="SLURM_PROCID"):
        Allocation.from_env({"SLURM_JOB_ID": "1"})


def test_het_group_node_lists_expand_like_slurm(slurm_cluster):
    alloc = Allocation.from_env(HET_ENV)
    assert alloc.nodes(0) == ("node1", "node2")
    assert alloc.nodes(1) == ("node3", "node4", "gpu07")
    single = Allocation.from_env({k: v for k, v in HET_ENV.items() if k != "SLURM_HET_SIZE"})
    assert single.nodes(0) == ("node1", "node2")
    with pytest.raises(AllocationError, match="one component"):
        single.nodes(1)
