"""What the project's command lines share: exit statuses and an argument parser that does not exit.

argparse ends the process on a usage error; our commands (leasectl, the consume job's driver) turn
it into `UsageError` instead, so `main(argv)` returns a status that tests and callers can check.
"""

from __future__ import annotations

import argparse

EXIT_OK = 0
EXIT_FAILED = 1  # AWS refused, or something the command needs is missing
EXIT_USAGE = 2  # bad arguments or configuration


class UsageError(Exception):
    """Bad arguments; the message does not name the program, which the command prefixes once."""


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # A subcommand's parser is named "<program> <command>": keep the command, drop the program.
        _program, _, command = self.prog.partition(" ")
        raise UsageError(f"{command}: {message}" if command else message)
