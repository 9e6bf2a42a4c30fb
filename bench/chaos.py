"""A randomized, seeded, time-bounded fault campaign against the real consume job on the emulators.

    .venv/bin/python bench/chaos.py --seed N --minutes M [--faults K] [--sink S] [--rate R] [--keep]
                                    [--summary FILE]

Rounds of the real consume job (spark-submit, Spark local mode) run against moto and kinesis-mock
with a producer writing the whole time, while seeded faults fire at random moments: SIGKILL of a
slot's Python worker, kill of the driver, a twin consume job, an Airflow-style retry, a leader that
dies holding the lock, a split and a merge, 30 % failing calls through the fault proxy, a reset,
a retention trim, and with a Delta table, a driver that dies, loses its answer or freezes at its table
commit. Then the faults stop, clean rounds drain the stream, and the sink (`--sink`: a
Parquet dataset, an Iceberg table or a Delta table) is checked: 0 duplicated, 0 lost (beyond
injected and reported retention losses), no lease stuck. It prints a table of fault kind, times
injected and outcomes; exit status 1 on any violation. The method is in bench/chaos/campaign.py;
the defaults are the long run of docs/operating.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.chaos.campaign import main

if __name__ == "__main__":
    sys.exit(main())
