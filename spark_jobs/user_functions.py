"""Whether the pipeline's decoder and transform load where the consume job's driver will load them,
asked before the job is submitted.

    python -m spark_jobs.user_functions [--decode SPEC] [--transform SPEC] ... --error-file PATH

The consume step runs this with the interpreter, the environment and the path (`py_files` first) that
spark-submit gives a driver running on the step's machine, so a decoder or transform that cannot be
loaded fails the step in a second instead of after Spark has started: the same `FunctionLoadError`
the job would report, written to `--error-file` as the job writes its own (`spark_jobs.job_errors`).
It takes the job's record-processing flags (`spark_jobs.record_processing`). Exit status 0 when both
load, 1 when one does not, 2 when a flag is wrong. The job checks them again where it runs.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from lease_core.ops.command_line import ArgumentParser, UsageError
from spark_jobs.decode import load_decoder
from spark_jobs.errors import FunctionLoadError
from spark_jobs.job_errors import write_job_error
from spark_jobs.record_processing import RecordProcessing
from spark_jobs.transform import load_transform


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(prog="user_functions", description="Check that the decoder and the transform load.")
    RecordProcessing.add_arguments(parser)
    parser.add_argument("--error-file", required=True, metavar="PATH")
    arguments = parser.parse_args(argv)
    try:
        processing = RecordProcessing.from_arguments(arguments)
    except UsageError as error:
        write_job_error(arguments.error_file, error)
        return 2
    try:
        load_decoder(processing.decode, processing.decode_options)
        load_transform(processing.transform)
    except FunctionLoadError as error:
        write_job_error(arguments.error_file, error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
