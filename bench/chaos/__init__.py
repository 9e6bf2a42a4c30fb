"""A seeded, time-bounded fault campaign against the real consume job on the local emulators.

`bench/chaos.py` is the command; this package holds its parts: the seeded schedule
(`schedule`), the processes it starts and kills (`processes`), the producer and its ledger
(`producer`), the round's leader (`leader`, and `dying_leader`, a leader process that is killed
while it holds the lock), the fault injections (`injections`), the final check (`verdict`) and the
campaign loop with its table (`campaign`). `transforms` runs inside the Spark executors, and
`commit_faults` is the Python driver of a try that meets a fault at its Delta table commit.
"""
