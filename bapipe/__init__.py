"""BaPipe: plan, simulate, generate and run pipeline-parallel DNN training on FPGA clusters.

Run as the `bapipe` console script, this is the first of the toolkit's code to execute:
Ctrl-C or SIGTERM before ``bapipe.cli.main`` takes over (while Python imports the command
line) ends the process with one line and exit 130 / 143 instead of a traceback or a silent
kill. Nothing has started or been written yet, so there is nothing to clean up.
"""
import os as _os
import signal as _signal
import sys as _sys


def _early_exit(signum, _frame):
    name = "terminated (SIGTERM)" if signum == _signal.SIGTERM else "interrupted"
    _os.write(2, f"bapipe: {name}\n".encode())
    _os._exit(143 if signum == _signal.SIGTERM else 130)


if _os.path.basename(_sys.argv[0] if _sys.argv else "") == "bapipe":
    for _s in (_signal.SIGINT, _signal.SIGTERM):
        if _signal.getsignal(_s) is not _signal.SIG_IGN:   # an ignored signal stays ignored (nohup, &)
            _signal.signal(_s, _early_exit)
