"""Write tests/cpu_seconds.json from CPU logs of suite runs (BAPIPE_TEST_CPU_LOG, tests/conftest.py).

    BAPIPE_TEST_CPU_LOG=/tmp/cpu.jsonl make test        # and/or make test-fast
    .venv/bin/python tests/cpu_table.py /tmp/cpu.jsonl   # rewrites tests/cpu_seconds.json

The table keeps the tests of at least ``KEEP_S`` CPU seconds (their largest figure over the logs);
tests/conftest.py marks those of at least ``FAST_CPU_S`` slow, so `make test-fast` stays within its
budget without a hand-kept list (docs/testing.md).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

#: tests below this are left out of the table (they are fast whatever the threshold)
KEEP_S = 0.2
TABLE = Path(__file__).with_name("cpu_seconds.json")


def table(logs: list[str]) -> dict[str, float]:
    """{nodeid: CPU seconds} of the tests at or over KEEP_S in ``logs``, the largest figure of each."""
    out: dict[str, float] = {}
    for log in logs:
        for line in Path(log).read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            out[row["test"]] = max(out.get(row["test"], 0.0), float(row["cpu_s"]))
    return {k: round(v, 1) for k, v in sorted(out.items()) if v >= KEEP_S}


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: cpu_table.py CPU_LOG [CPU_LOG ...]")
    TABLE.write_text(json.dumps(table(sys.argv[1:]), indent=0) + "\n", encoding="utf-8")
    print(f"wrote {TABLE}")
