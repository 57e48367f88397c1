"""The target return's bookkeeping in a world of one (no notices to hear: the MPI side runs under
mpiexec in test_program_target.py)."""

import pytest

from podracer_hpc.cluster.mpi import Comm
from podracer_hpc.rank.target import Target


@pytest.mark.parametrize(
    "value,means,reached",
    [
        (-200.0, [-900.0, -250.0, -199.0, -150.0, -300.0], 3),  # the first evaluation at or above it
        (-200.0, [-900.0, -200.0, -100.0], 2),  # at counts
        (-200.0, [-900.0, -201.0], 0),  # never
        (None, [-900.0, 100.0], 0),  # no target: nothing is reached
    ],
)
def test_a_pod_reaches_the_target_at_its_first_evaluation_at_or_above_it(value, means, reached):
    t, comm = Target(value), Comm(note="test")
    for i, m in enumerate(means, start=1):
        t.evaluated(m, i * 1000, comm)
    assert t.reached == reached * 1000 and t.at == (reached * 1000 or None)


@pytest.mark.parametrize(
    "env_steps,round_due,want",
    [(2000, False, ""), (3000, False, "target"), (4000, False, "target"), (3000, True, "")],
)
def test_it_stops_where_it_reached_once_no_round_is_due_there(env_steps, round_due, want):
    t, comm = Target(-200.0), Comm(note="test")
    t.evaluated(-150.0, 3000, comm)
    assert t.poll(comm, env_steps, round_due) == want and t.stopped == (want == "target")


@pytest.mark.parametrize("reached_for,want", [(-200.0, 5000), (-100.0, 0), (None, 0)])
def test_a_resume_keeps_a_crossing_of_the_same_target_only(reached_for, want):
    t = Target(-200.0)
    t.resume(5000, reached_for, Comm(note="test"))
    assert t.reached == want and t.poll(Comm(note="test"), 5000, False) == ("target" if want else "")
