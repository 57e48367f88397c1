"""Which checkpoint every rank resumes from (resume.choose): the same round for all, or a clear error."""

import json
import math

import pytest

from podracer_hpc.rank.resume import FileState, RankFiles, ResumeError, choose, rotate_prev


def at(u, epoch=0, ws=None):
    return FileState(exists=True, updates=u, world_size=ws, epoch=epoch)


MISSING = FileState()
CORRUPT = FileState(exists=True, error="rank0.safetensors: checksum mismatch: the file is corrupt")


def rf(ckpt=MISSING, prev=MISSING):
    return RankFiles(ckpt, prev)


def test_no_files_anywhere_is_a_fresh_start():
    c = choose([rf(), rf()], 2)
    assert c.fresh and not c.notes


def test_pods_resume_from_their_own_latest_state_within_one_round():
    """Pods checkpoint on their own clocks between rounds: different updates are consistent."""
    c = choose([rf(at(12, 3), at(8, 2)), rf(at(9, 3), at(7, 2))], 2)
    assert not c.fresh and c.use == ("ckpt", "ckpt") and c.updates == (12, 9) and c.epoch == 3


def test_a_kill_between_the_ranks_post_round_checkpoints_brings_the_ahead_ranks_back():
    c = choose([rf(at(12, 4), at(10, 3)), rf(at(10, 3), at(6, 2)), rf(at(12, 4), at(10, 3))], 3)
    assert c.epoch == 3 and c.use == ("prev", "ckpt", "prev") and c.updates == (10, 10, 10)
    assert any("past the round the other ranks reached" in n for n in c.notes)


def test_a_torn_first_checkpoint_starts_over():
    """The chaos run's 'ranks [1] have no checkpoint while others do': no rank ever had a .prev."""
    c = choose([rf(at(0)), rf()], 2)
    assert c.fresh and "starting over" in c.notes[0]
    assert choose([rf(at(3)), rf(at(3)), rf()], 3).fresh


def test_a_lost_rank_with_history_is_an_error_not_a_silent_restart():
    with pytest.raises(ResumeError, match="rank 1: checkpoint missing, .prev missing"):
        choose([rf(at(8), at(4)), rf()], 2)


def test_a_corrupt_checkpoint_falls_back_to_prev_naming_the_checksum_error():
    c = choose([rf(CORRUPT, at(4, 1)), rf(at(8, 2), at(4, 1))], 2)
    assert c.epoch == 1 and c.use == ("prev", "prev") and c.updates == (4, 4)
    assert "checksum mismatch" in c.notes[0] and "rank 0" in c.notes[0]
    c = choose([rf(CORRUPT, at(4, 2)), rf(at(8, 2), at(4, 1))], 2)
    assert c.use == ("prev", "ckpt") and c.updates == (4, 8)  # the same round: each its latest


def test_corrupt_beyond_repair_names_the_checksum_error():
    with pytest.raises(ResumeError, match="(?s)cannot be brought to one round.*checksum mismatch"):
        choose([rf(CORRUPT, CORRUPT), rf(at(8), at(4))], 2)
    with pytest.raises(ResumeError, match="checksum mismatch"):
        choose([rf(CORRUPT)], 1)


def test_a_rank_two_rounds_ahead_cannot_be_brought_back():
    with pytest.raises(ResumeError, match="cannot be brought to one round"):
        choose([rf(at(20, 5), at(16, 4)), rf(at(8, 3), at(4, 2))], 2)


def test_another_world_size_is_refused():
    with pytest.raises(ResumeError, match="2-rank run, and 1 rank"):
        choose([rf(at(8, ws=2), at(4, ws=2))], 1)
    with pytest.raises(ResumeError, match="3-rank run, and 2 rank"):
        choose([rf(at(8)), rf(at(8))], 2, other_ranks=[2])  # no world size recorded (old files), rank2 files


def test_independent_pods_resume_each_from_its_own_latest_and_a_new_one_starts_fresh():
    c = choose([rf(at(20, 5), at(16, 4)), rf(at(8, 3), at(4, 2)), rf()], 3, independent=True)
    assert c.use == ("ckpt", "ckpt", "fresh") and c.updates == (20, 8, 0)
    c = choose([rf(CORRUPT, at(16, 4)), rf(at(8, 3))], 2, independent=True)
    assert c.use == ("prev", "ckpt")


@pytest.mark.parametrize(
    "ckpt,prev,new,independent,rotate",
    [
        (None, None, 0, False, False),  # nothing to keep
        (0, None, 0, False, True),  # first epoch: rolling
        (0, 0, 0, False, True),
        (0, 0, 1, False, True),  # the post-round checkpoint: prev = the last state of round 0
        (1, 0, 1, False, False),  # later in epoch 1: keep round 0's last state
        (1, 0, 1, True, True),  # independent pods: always rolling
        (1, 1, 1, False, True),
    ],
)
def test_prev_keeps_the_last_state_of_the_previous_round(ckpt, prev, new, independent, rotate):
    assert rotate_prev(ckpt, prev, new, independent) == rotate


@pytest.mark.parametrize(
    "meta, check",
    [
        (
            {},
            lambda s: (
                s.round == 0 and s.best_return == -math.inf and math.isnan(s.last_eval_return) and s.log_rows is None
            ),
        ),
        (
            {
                "round": 3,
                "best_return": -1.5,
                "next_round": 8192,
                "log_rows": {"train": 4},
                "pending_round": [3, {"m": 1}],
            },
            lambda s: (
                s.round == 3
                and s.best_return == -1.5
                and s.next_round == 8192
                and s.log_rows == {"train": 4}
                and s.pending_for(3) == {"m": 1}
                and s.pending_for(2) is None
            ),
        ),
        (
            {"round": "x", "log_rows": [1], "pending_round": [1], "world_size": None, "next_eval": None},
            lambda s: (
                s.round == 0
                and s.log_rows is None
                and s.pending_round is None
                and s.world_size is None
                and s.next_eval == 0
            ),
        ),
    ],
)
def test_rank_state_reads_any_checkpoint_meta_back_with_defaults(meta, check):
    """The run loop's record in a checkpoint: what an older or damaged meta lacks takes the default
    that older code used, and what it writes reads back the same."""
    from podracer_hpc.rank.state import RankState

    s = RankState.from_meta(meta)
    assert check(s)
    assert json.dumps(RankState.from_meta(s.to_meta()).to_meta()) == json.dumps(s.to_meta())  # (NaN != NaN)
