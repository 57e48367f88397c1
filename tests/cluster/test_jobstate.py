"""What Slurm says about how a job ended (cluster/jobstate.py): sacct's state with who cancelled it
and its nodes, and the node srun names for a task that died, on the text Slurm 22.05 prints."""

from __future__ import annotations

from podracer_hpc.cluster.jobstate import JobEnd, parse_end, srun_failed_nodes

SRUN_KILLED = """podracer: MPIR_CVAR_CH4_NETMOD=ofi
srun: error: n1: task 0: Killed
srun: launch/slurm: _step_signal: Terminating StepId=2111003.0
srun: error: n2: tasks 1-3: Terminated
"""


def test_sacct_says_who_cancelled_and_where_a_job_ran():
    text = "12_1|CANCELLED by 1000|0:15|n3\n12_2|FAILED|137:0|n[1-2]\n13|PENDING|0:0|None assigned\n"
    assert parse_end(text, "12_1") == JobEnd("CANCELLED", 1000, "0:15", "n3")
    assert parse_end(text, "12_2") == JobEnd("FAILED", None, "137:0", "n[1-2]")
    assert parse_end(text, "13") == JobEnd("PENDING", None, "0:0", "")
    assert parse_end(text, "14") is None


def test_srun_names_the_node_of_the_task_that_died_first():
    assert srun_failed_nodes(SRUN_KILLED) == ["n1", "n2"]
    assert srun_failed_nodes("srun: error: n4: task 2: Exited with exit code 3\n") == ["n4"]
    assert srun_failed_nodes("no srun here\n") == []
