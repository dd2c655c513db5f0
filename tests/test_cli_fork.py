"""tests/cli_fork.py, the fork server of the CLI sweep, against the installed console script."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_fork import ForkServer

BAPIPE = str(Path(sys.executable).with_name("bapipe"))
CASES = [
    ["plan", "tiny-mlp", "nosuch", "-o", "x.yaml"],          # exit 2, one line on stderr
    ["clusters", "--json"],                                  # exit 0, one JSON object on stdout
    ["export", "tiny-mlp", "-o", "m.onnx", "--json"],        # a file written in the working folder
]


@pytest.mark.slow  # ~1 s of CPU: make test, not make test-fast (docs/testing.md)
def test_fork_server_gives_what_the_console_script_gives(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "BAPIPE_DEBUG"}
    server = ForkServer(env)
    try:
        for i, args in enumerate(CASES):
            a, b = tmp_path / f"script{i}", tmp_path / f"fork{i}"
            a.mkdir()
            b.mkdir()
            want = subprocess.run([BAPIPE, *args], cwd=a, capture_output=True, text=True, timeout=120, env=env)
            got = server.run(args, b)
            assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr), args
            assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir()), args
            for f in a.iterdir():
                assert f.read_bytes() == (b / f.name).read_bytes(), (args, f.name)
    finally:
        server.close()
