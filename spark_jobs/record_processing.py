"""How a round turns records into rows: one typed set of options, defined once here.

The options travel as one object. A pipeline takes them as keywords (`kinesis_lease.pipeline`) and
offers each on the trigger form (`trigger_params`); the DAG's plan (`kinesis_lease.round_plan`) checks
a run's params with `from_options` and keeps the result, serialized once, as the plan's `processing`;
the consume step and the idle check read it back (`from_options` again, the same checks) and hand it to
the job as command-line flags (`to_arguments`); the job's parser declares those flags from the same
fields (`add_arguments`) and checks them the same way (`from_arguments`). A new option is a new field
here: its check, its flag's help and its trigger-form field in its metadata, nothing anywhere else.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from lease_core.errors import ConfigurationError
from lease_core.ops.command_line import UsageError
from spark_jobs.dead_letters import BAD_RECORD_ACTIONS, DEFAULT_MAX_SHARE, WHOLESALE_MIN_REJECTED, BadRecordPolicy
from spark_jobs.decode import BUILT_IN_DECODERS, built_in_decoder


def _user_function(value: Any) -> str | None:
    """A user's function (transform, decoder), `package.module:function`, imported where the job runs."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    text = str(value).strip()
    module, _, function = text.partition(":")
    names_ok = all(part.isidentifier() for part in module.split(".")) and function.isidentifier()
    if not (isinstance(value, str) and names_ok):
        raise ValueError(f"must be of the form 'package.module:function', got {value!r}")
    return text


def _decoder(value: Any) -> str | None:
    """A built-in decoder's name (`spark_jobs.decode.BUILT_IN_DECODERS`), or the user's function."""
    if isinstance(value, str) and value.strip() in BUILT_IN_DECODERS:
        return value.strip()
    try:
        return _user_function(value)
    except ValueError:
        built_in = ", ".join(BUILT_IN_DECODERS)
        problem = f"must be a built-in decoder ({built_in}) or 'package.module:function', got {value!r}"
        raise ValueError(problem) from None


def _decoder_options(value: Any) -> dict[str, Any]:
    """A built-in decoder's options: a mapping (a flag's text: a JSON object); checked by the decoder."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise ValueError(f"must be a JSON object, got {value!r} ({error})") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"must be a mapping of option names to values, got {value!r}")
    return dict(value)


def _bad_record_action(value: Any) -> str:
    action = value or "fail"
    if action not in BAD_RECORD_ACTIONS:
        raise ValueError(f"must be one of {', '.join(BAD_RECORD_ACTIONS)}, got {action!r}")
    return str(action)


def _share(value: Any) -> float:
    """A share of a batch: a number above 0 and at most 1 (a flag's text, or a param's number)."""
    if value is None or value == "":
        return DEFAULT_MAX_SHARE
    try:
        share = float(value) if isinstance(value, str) else value
    except ValueError:
        share = None
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
        raise ValueError(f"must be a number above 0 and at most 1, got {value!r}")
    return float(share)


def _option(parse: Callable[[Any], Any], metavar: str, help: str, form: Mapping[str, Any]) -> dict[str, Any]:
    """A field's metadata: its check (a value in, the option's value out, `ValueError` naming what is
    wrong), its flag's metavar and help, and its trigger-form field (Airflow `Param` keywords: a JSON
    Schema and a description)."""
    return {"parse": parse, "metavar": metavar, "help": help, "form": form}


FUNCTION_SPEC = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"


@dataclass(frozen=True)
class RecordProcessing:
    """The round's record-processing options, each checked (`from_options`): build it from there."""

    transform: str | None = field(
        default=None,
        metadata=_option(
            _user_function,
            "MODULE:FUNCTION",
            "a function pyarrow.Table -> pyarrow.Table applied to each batch before it is written",
            {
                "type": ["null", "string"],
                "pattern": FUNCTION_SPEC,
                "description": "Your batch transform, package.module:function (an Arrow table of the records in, "
                "one out), importable where Spark runs; none: the records as they are.",
            },
        ),
    )
    decode: str | None = field(
        default=None,
        metadata=_option(
            _decoder,
            "{" + ",".join(BUILT_IN_DECODERS) + "}|MODULE:FUNCTION",
            "a built-in decoder by name, or a function (payload bytes, record) -> row (a mapping) or None, "
            "applied to each record before the transform",
            {
                "type": ["null", "string"],
                "pattern": f"^(?:{'|'.join(BUILT_IN_DECODERS)})$|{FUNCTION_SPEC}",
                "description": f"A built-in decoder ({', '.join(BUILT_IN_DECODERS)}), or your per-record decoder, "
                "package.module:function (payload bytes and the record in, a row out), importable where Spark "
                "runs; none: the records as they are.",
            },
        ),
    )
    decode_options: dict[str, Any] = field(
        default_factory=dict,
        metadata=_option(
            _decoder_options,
            "JSON",
            "the built-in decoder's options, a JSON object (docs/decoders.md)",
            {
                "type": "object",
                "description": "The built-in decoder's options (docs/decoders.md): for json, its schema; for avro, "
                "its schema or schema_file; for protobuf, its schema or schema_file (the .proto file) and message; "
                "for glue_schema_registry, its endpoint_url (optional); cloudwatch_logs and dynamodb take none.",
            },
        ),
    )
    bad_records: str = field(
        default="fail",
        metadata=_option(
            _bad_record_action,
            "{" + ",".join(BAD_RECORD_ACTIONS) + "}",
            "what a record the decoder rejects does: fail its lease (the default), or go to the dead-letter "
            "destination beside the output (the rest of its batch lands)",
            {
                "enum": list(BAD_RECORD_ACTIONS),
                "description": "What a record your decoder rejects does: fail its lease (loud; nothing moves until "
                "it is fixed), or dead_letter: set it aside beside the output with its error, and land the rest.",
            },
        ),
    )
    dead_letter_max_share: float = field(
        default=DEFAULT_MAX_SHARE,
        metadata=_option(
            _share,
            "SHARE",
            "with --bad-records dead_letter: a batch with more of its records rejected than this share (and at "
            f"least {WHOLESALE_MIN_REJECTED}) fails its lease instead (the processing fails, not a few records)",
            {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": 1,
                "description": "With dead_letter: a batch with more of its records rejected than this share (and at "
                f"least {WHOLESALE_MIN_REJECTED}) fails its lease instead: the processing fails, not a few records.",
            },
        ),
    )

    @classmethod
    def from_options(cls, values: Mapping[str, Any]) -> RecordProcessing:
        """The options from `values` (a run's params, or the job's flags by option name), each checked;
        `ConfigurationError` naming the first option that is wrong. Keys that are no option are ignored."""
        parsed: dict[str, Any] = {}
        for option in fields(cls):
            try:
                parsed[option.name] = option.metadata["parse"](values.get(option.name))
            except ValueError as error:
                raise ConfigurationError(option.name, str(error)) from None
        parsed["decode_options"] = _checked_decoder_options(parsed["decode"], parsed["decode_options"])
        if parsed["bad_records"] == "dead_letter" and parsed["decode"] is None:
            needs = "dead_letter needs a decoder (decode): it rejects records one by one"
            raise ConfigurationError("bad_records", needs)
        return cls(**parsed)

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        return tuple(option.name for option in fields(cls))

    def to_dict(self) -> dict[str, Any]:
        """The options as plain values (JSON): what the round's plan carries to its steps."""
        return {option.name: getattr(self, option.name) for option in fields(self)}

    def trigger_params(self) -> dict[str, dict[str, Any]]:
        """Each option's trigger-form field, `Param` keywords with these options' values as defaults."""
        return {
            option.name: {"default": getattr(self, option.name), **option.metadata["form"]} for option in fields(self)
        }

    @property
    def bad_record_policy(self) -> BadRecordPolicy:
        return BadRecordPolicy(self.bad_records, self.dead_letter_max_share)  # type: ignore[arg-type]  # checked

    def to_arguments(self) -> list[str]:
        """The job's flags for these options; a default is left out."""
        arguments: list[str] = []
        for option in fields(self):
            value = getattr(self, option.name)
            default = option.default_factory() if option.default is MISSING else option.default  # type: ignore[operator]
            if value != default:
                arguments += [_flag(option.name), json.dumps(value) if isinstance(value, Mapping) else str(value)]
        return arguments

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """One flag per option (`--bad-records` for `bad_records`), taken as text: `from_arguments` checks it."""
        for option in fields(cls):
            parser.add_argument(_flag(option.name), metavar=option.metadata["metavar"], help=option.metadata["help"])

    @classmethod
    def from_arguments(cls, arguments: argparse.Namespace) -> RecordProcessing:
        """The options from the job's parsed flags; `UsageError` naming the flag that is wrong."""
        try:
            return cls.from_options(vars(arguments))
        except ConfigurationError as error:
            raise UsageError(f"{_flag(error.key)}: {error.problem}") from None


def _checked_decoder_options(decode: str | None, options: dict[str, Any]) -> dict[str, Any]:
    """A built-in decoder's options as it reads them back; a user's decoder takes none."""
    if decode not in BUILT_IN_DECODERS:
        if options:
            raise ConfigurationError("decode_options", f"are for a built-in decoder, not {decode!r}")
        return {}
    try:
        return built_in_decoder(decode, options).options()
    except ValueError as error:
        raise ConfigurationError("decode_options", str(error)) from None


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")
