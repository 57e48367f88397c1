"""cluster/signals.py: the stop flag names the signal a user sent, also through podracer mpirun's SIGTERM."""

import signal

from podracer_hpc.cluster.signals import RELAYED_SIGNAL_ENV, StopFlag, relayed_signal


def test_a_relayed_sigterm_is_named_after_the_signal_the_relay_got(tmp_path, monkeypatch):
    flag = StopFlag()
    flag(signal.SIGTERM, None)
    monkeypatch.delenv(RELAYED_SIGNAL_ENV, raising=False)
    assert flag.name == "SIGTERM"  # no relay: the signal itself
    named = tmp_path / "signal"
    monkeypatch.setenv(RELAYED_SIGNAL_ENV, str(named))
    assert flag.name == "SIGTERM"  # a relay that relayed nothing yet (a SIGTERM sent to the rank itself)
    named.write_text("SIGINT")
    assert relayed_signal() == "SIGINT" and flag.name == "SIGINT"
    named.write_text("rm -rf /")  # not a signal's name: ignored
    assert relayed_signal() == "" and flag.name == "SIGTERM"
    usr2 = StopFlag()
    usr2(signal.SIGUSR2, None)
    named.write_text("SIGINT")
    assert usr2.name == "SIGUSR2"  # only the relay's own SIGTERM is renamed
    assert StopFlag().name == ""
