"""Which checkpoint every rank resumes from (resume.choose): the same update for all, or a clear error."""

import pytest

from podracer_hpc.resume import FileState, RankFiles, ResumeError, choose


def at(u, ws=None):
    return FileState(exists=True, updates=u, world_size=ws)


MISSING = FileState()
CORRUPT = FileState(exists=True, error="rank0.safetensors: checksum mismatch: the file is corrupt")


def rf(ckpt=MISSING, prev=MISSING):
    return RankFiles(ckpt, prev)


def test_no_files_anywhere_is_a_fresh_start():
    c = choose([rf(), rf()], 2)
    assert c.fresh and not c.notes


def test_all_at_the_same_update():
    c = choose([rf(at(8), at(4)), rf(at(8), at(4))], 2)
    assert not c.fresh and c.updates == 8 and c.use_prev == (False, False)


def test_a_kill_between_ranks_checkpoints_brings_the_ahead_ranks_back():
    c = choose([rf(at(12), at(8)), rf(at(8), at(4)), rf(at(12), at(8))], 3)
    assert c.updates == 8 and c.use_prev == (True, False, True)
    assert any("ahead of other ranks" in n for n in c.notes)


def test_a_torn_first_checkpoint_starts_over():
    """The chaos run's 'ranks [1] have no checkpoint while others do': no rank ever had a .prev."""
    c = choose([rf(at(0)), rf()], 2)
    assert c.fresh and "starting over" in c.notes[0]
    c = choose([rf(at(3)), rf(at(3)), rf()], 3)
    assert c.fresh


def test_a_lost_rank_with_history_is_an_error_not_a_silent_restart():
    with pytest.raises(ResumeError, match="rank 1: checkpoint missing, .prev missing"):
        choose([rf(at(8), at(4)), rf()], 2)


def test_a_corrupt_checkpoint_falls_back_to_prev_naming_the_checksum_error():
    c = choose([rf(CORRUPT, at(4)), rf(at(8), at(4))], 2)
    assert c.updates == 4 and c.use_prev == (True, True)
    assert "checksum mismatch" in c.notes[0] and "rank 0" in c.notes[0]


def test_corrupt_beyond_repair_names_the_checksum_error():
    with pytest.raises(ResumeError, match="(?s)cannot be brought to one update.*checksum mismatch"):
        choose([rf(CORRUPT, CORRUPT), rf(at(8), at(4))], 2)
    with pytest.raises(ResumeError, match="checksum mismatch"):
        choose([rf(CORRUPT)], 1)


def test_another_world_size_is_refused():
    with pytest.raises(ResumeError, match="2-rank run, and 1 rank"):
        choose([rf(at(8, ws=2), at(4, ws=2))], 1)
    with pytest.raises(ResumeError, match="3-rank run, and 2 rank"):
        choose([rf(at(8)), rf(at(8))], 2, other_ranks=[2])  # no world size recorded (old files), rank2 files


@pytest.mark.parametrize("size", [1, 2, 5])
def test_one_rank_world_and_bigger_worlds_agree_at_the_latest_common_update(size):
    files = [rf(at(10 + (r % 2) * 5), at(10)) for r in range(size)]
    c = choose(files, size)
    assert c.updates == 10 and c.use_prev == tuple(r % 2 == 1 for r in range(size))
