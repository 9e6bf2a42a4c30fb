"""A leader process that the campaign kills while it holds the application's leader lock.

    python -m bench.chaos.dying_leader --owner NAME --stream S --workers W --set KEY=VALUE ...

It takes the lock (exit 3 if it cannot), prints `holding <version>`, runs shard sync and an
assignment round under the lock as a round's leader does, prints `assigned <round>`, and then keeps
heartbeating the lock until it is killed: a leader alive and holding, until it is not.
"""

from __future__ import annotations

import argparse
import sys
import threading

from bench.chaos.leader import lead, leader_lock
from lease_core.config.settings import load_config
from lease_core.leader.leader_lock import LockHeartbeat


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos.dying_leader")
    parser.add_argument("--owner", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    arguments = parser.parse_args(argv)
    config = load_config(environ={}, overrides=arguments.overrides)
    lock = leader_lock(config, arguments.owner)
    if not lock.try_acquire():
        print(f"refused: {lock.unavailable()}", flush=True)
        return 3
    print(f"holding {lock.record_version_number}", flush=True)
    _, assigned = lead(config, arguments.owner, [arguments.stream], arguments.workers)
    print(f"assigned {assigned.round_number}", flush=True)
    holding = leader_lock(config, arguments.owner)
    if not holding.resume_as_owner():
        print(f"lost: {holding.unavailable()}", flush=True)
        return 3
    with LockHeartbeat(holding):
        threading.Event().wait()  # until killed
    return 0


if __name__ == "__main__":
    sys.exit(main())
