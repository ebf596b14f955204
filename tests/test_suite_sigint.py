"""The suite's children see Ctrl-C, however the suite was launched (D112).

A run started in the background by a script or under ``nohup`` inherits SIGINT ignored,
and an ignored signal stays ignored across ``exec``: the processes the Ctrl-C tests start
(the hub, the echo example, the connector) would never see their SIGINT. ``conftest.py``
gives SIGINT its default handling back when the suite starts.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

CHILD_SEES_SIGINT = "import signal; print(signal.getsignal(signal.SIGINT) is not signal.SIG_IGN)"


def test_a_child_of_the_suite_sees_ctrl_c():
    out = subprocess.run([sys.executable, "-c", CHILD_SEES_SIGINT], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True", out.stderr


def test_the_suite_launched_with_ctrl_c_ignored_still_hands_it_to_its_children():
    # The suite again, started the way a background launch starts it: SIGINT ignored.
    launcher = (
        "import signal, sys, pytest; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "sys.exit(pytest.main(sys.argv[1:]))"
    )
    here = f"{Path(__file__).name}::test_a_child_of_the_suite_sees_ctrl_c"
    out = subprocess.run(
        [sys.executable, "-c", launcher, "-q", "-p", "no:randomly", "-p", "no:cacheprovider", here],
        cwd=TESTS, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
