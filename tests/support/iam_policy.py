"""A small IAM evaluator: which recorded AWS calls an identity policy allows, and which of its grants were used.

Enough of IAM's identity-policy evaluation for the policy in docs/iam-policy.json: Allow statements
with `Action` and `Resource` lists (case-insensitive action globs, case-sensitive ARN globs, `*` and
`?` both), and `StringEquals`/`StringLike` conditions (with `IfExists`). Anything else in a policy
(Deny, NotAction, NotResource, Principal, other condition operators, an unresolved `${Placeholder}`)
is refused when the policy is loaded, so a policy can never rely on something this evaluator ignores.

`iam_requests` maps one call a `FaultProxy` recorded to the IAM requests AWS authorizes for it:
`dynamodb:<Operation>` on the table (or `.../index/<IndexName>`), plus `dynamodb:TagResource` for a
CreateTable with Tags; `kinesis:<Operation>` on the stream; `cloudwatch:<Operation>` on `*` with its
`cloudwatch:namespace`; `glue:<Operation>` on the catalog and on each database and table the call
names (a table's call names its database as well: AWS authorizes a Glue call on every resource in
its path); S3 REST operations to their IAM actions on the object or the bucket (ListObjects* and
HeadBucket are `s3:ListBucket`, with `s3:prefix` when the request has one; an object read answered
404 is `s3:ListBucket` on the bucket as well, without which S3 answers 403; a DeleteObjects is
`s3:DeleteObject` on each key it names).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from devtools.fault_proxy import RecordedCall

POLICY_VERSION = "2012-10-17"
_PLACEHOLDER = re.compile(r"\$\{(\w+)\}")
_STATEMENT_KEYS = frozenset({"Sid", "Effect", "Action", "Resource", "Condition"})
_CONDITION_OPERATORS = frozenset({"StringEquals", "StringLike", "StringEqualsIfExists", "StringLikeIfExists"})

# S3 REST operation -> IAM action; object operations act on bucket/key, the rest on the bucket.
S3_OBJECT_ACTIONS = {
    "GetObject": "s3:GetObject",
    "HeadObject": "s3:GetObject",
    "PutObject": "s3:PutObject",
    "CreateMultipartUpload": "s3:PutObject",
    "UploadPart": "s3:PutObject",
    "CompleteMultipartUpload": "s3:PutObject",
    "CopyObject": "s3:PutObject",
    "AbortMultipartUpload": "s3:AbortMultipartUpload",
    "ListParts": "s3:ListMultipartUploadParts",
    "DeleteObject": "s3:DeleteObject",
    "GetObjectTagging": "s3:GetObjectTagging",
    "PutObjectTagging": "s3:PutObjectTagging",
}
S3_BUCKET_ACTIONS = {
    "HeadBucket": "s3:ListBucket",
    "ListObjects": "s3:ListBucket",
    "ListObjectsV2": "s3:ListBucket",
    "ListObjectVersions": "s3:ListBucketVersions",
    "ListMultipartUploads": "s3:ListBucketMultipartUploads",
    "GetBucketLocation": "s3:GetBucketLocation",
    "CreateBucket": "s3:CreateBucket",
    "DeleteBucket": "s3:DeleteBucket",
    "DeleteObjects": "s3:DeleteObject",
}
# A read of a missing object answers 404 only to a caller allowed s3:ListBucket on the bucket (403 otherwise).
S3_READS = frozenset({"GetObject", "HeadObject"})
# Glue listings act on every database, or on every table of the database they name.
GLUE_LISTINGS = {"GetDatabases": "database/*", "GetTables": "table/{database}/*"}


@cache
def _glob(pattern: str, ignore_case: bool) -> re.Pattern[str]:
    """IAM's wildcards: `*` any run of characters (`/` and `:` included), `?` one character, nothing else special."""
    body = "".join(".*" if char == "*" else "." if char == "?" else re.escape(char) for char in pattern)
    return re.compile(body, re.DOTALL | (re.IGNORECASE if ignore_case else 0))


def glob_matches(pattern: str, value: str, *, ignore_case: bool = False) -> bool:
    return _glob(pattern, ignore_case).fullmatch(value) is not None


class PolicyError(ValueError):
    """The policy document uses something this evaluator does not model, or is malformed."""


@dataclass(frozen=True)
class IamRequest:
    action: str
    resource: str
    context: Mapping[str, str] = field(default_factory=dict)
    call: str = ""  # what the client called, for failure messages

    def __str__(self) -> str:
        context = f" {dict(self.context)}" if self.context else ""
        return f"{self.action} on {self.resource}{context} (from {self.call})"


@dataclass(frozen=True)
class Statement:
    sid: str
    actions: tuple[str, ...]
    resources: tuple[str, ...]
    conditions: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)

    def action_matching(self, action: str) -> str | None:
        return next((pattern for pattern in self.actions if glob_matches(pattern, action, ignore_case=True)), None)

    def resource_matching(self, resource: str) -> str | None:
        return next((pattern for pattern in self.resources if glob_matches(pattern, resource)), None)

    def conditions_hold(self, context: Mapping[str, str]) -> bool:
        for operator, keys in self.conditions.items():
            if_exists = operator.endswith("IfExists")
            for key, allowed in keys.items():
                value = context.get(key)
                if value is None:
                    if not if_exists:
                        return False
                    continue
                like = operator.startswith("StringLike")
                if not any(glob_matches(pattern, value) if like else value == pattern for pattern in allowed):
                    return False
        return True


@dataclass(frozen=True)
class Grant:
    """One action or one resource a statement names."""

    sid: str
    kind: str  # "action" or "resource"
    pattern: str

    def __str__(self) -> str:
        return f"{self.sid}: {self.kind} {self.pattern}"


@dataclass(frozen=True)
class Policy:
    statements: tuple[Statement, ...]

    def allowing(self, request: IamRequest) -> list[tuple[Statement, str, str]]:
        """Every statement that allows `request`, with the action and resource pattern that matched."""
        matches = []
        for statement in self.statements:
            action = statement.action_matching(request.action)
            resource = statement.resource_matching(request.resource)
            if action is not None and resource is not None and statement.conditions_hold(request.context):
                matches.append((statement, action, resource))
        return matches

    def grants(self) -> set[Grant]:
        return {
            *(Grant(s.sid, "action", action) for s in self.statements for action in s.actions),
            *(Grant(s.sid, "resource", resource) for s in self.statements for resource in s.resources),
        }


@dataclass(frozen=True)
class Evaluation:
    denied: list[IamRequest]
    used: set[Grant]
    actions: dict[str, int]  # IAM action -> requests

    def unused(self, policy: Policy) -> set[Grant]:
        return policy.grants() - self.used


def evaluate(policy: Policy, requests: Iterable[IamRequest]) -> Evaluation:
    denied: list[IamRequest] = []
    used: set[Grant] = set()
    actions: dict[str, int] = {}
    for request in requests:
        actions[request.action] = actions.get(request.action, 0) + 1
        matches = policy.allowing(request)
        if not matches:
            denied.append(request)
        for statement, action, resource in matches:
            used.update({Grant(statement.sid, "action", action), Grant(statement.sid, "resource", resource)})
    return Evaluation(denied, used, dict(sorted(actions.items())))


# --- the policy document ---------------------------------------------------------------------------


def substitute(text: str, values: Mapping[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        if match[1] not in values:
            raise PolicyError(f"no value for the placeholder ${{{match[1]}}}")
        return values[match[1]]

    return _PLACEHOLDER.sub(value, text)


def load_policy(path: Path, values: Mapping[str, str]) -> Policy:
    """The policy at `path` with its `${Name}` placeholders replaced by `values`."""
    return parse_policy(json.loads(substitute(path.read_text(), values)))


def parse_policy(document: Mapping[str, Any]) -> Policy:
    if document.get("Version") != POLICY_VERSION:
        raise PolicyError(f"Version must be {POLICY_VERSION!r}, got {document.get('Version')!r}")
    if set(document) - {"Version", "Id", "Statement"}:
        raise PolicyError(f"unexpected top-level keys {sorted(set(document) - {'Version', 'Id', 'Statement'})}")
    statements = tuple(_statement(entry) for entry in document["Statement"])
    sids = [statement.sid for statement in statements]
    if len(set(sids)) != len(sids):
        raise PolicyError(f"Sids must be unique, got {sids}")
    return Policy(statements)


def _statement(entry: Mapping[str, Any]) -> Statement:
    sid = entry.get("Sid")
    if not isinstance(sid, str) or not re.fullmatch(r"[A-Za-z0-9]+", sid):
        raise PolicyError(f"every statement needs an alphanumeric Sid, got {sid!r}")
    if set(entry) - _STATEMENT_KEYS:
        raise PolicyError(f"{sid}: unsupported keys {sorted(set(entry) - _STATEMENT_KEYS)}")
    if entry.get("Effect") != "Allow":
        raise PolicyError(f"{sid}: only Allow statements belong in this policy, got Effect {entry.get('Effect')!r}")
    conditions = {}
    for operator, keys in (entry.get("Condition") or {}).items():
        if operator not in _CONDITION_OPERATORS:
            raise PolicyError(f"{sid}: condition operator {operator} is not modelled")
        conditions[operator] = {key: _strings(sid, key, value) for key, value in keys.items()}
    return Statement(
        sid, _strings(sid, "Action", entry.get("Action")), _strings(sid, "Resource", entry.get("Resource")), conditions
    )


def _strings(sid: str, name: str, value: Any) -> tuple[str, ...]:
    values = [value] if isinstance(value, str) else value
    if not values or not all(isinstance(item, str) and item for item in values):
        raise PolicyError(f"{sid}: {name} must be a non-empty string or list of strings, got {value!r}")
    return tuple(values)


# --- recorded calls as IAM requests ---------------------------------------------------------------


def iam_requests(call: RecordedCall, region: str, account: str) -> list[IamRequest]:
    """The IAM requests AWS would authorize for one recorded call."""
    described = _describe(call)
    if call.service == "dynamodb":
        return _dynamodb_requests(call, f"arn:aws:dynamodb:{region}:{account}", described)
    if call.service == "kinesis":
        stream = call.stream if call.stream is not None else "(unknown: the proxy never saw its iterator or token)"
        resource = f"arn:aws:kinesis:{region}:{account}:stream/{stream}"
        return [IamRequest(f"kinesis:{call.operation}", resource, call=described)]
    if call.service == "glue":
        return _glue_requests(call, f"arn:aws:glue:{region}:{account}", described)
    if call.service == "s3":
        return _s3_requests(call, described)
    if call.service == "cloudwatch":
        # CloudWatch's actions have no resources; PutMetricData's namespace is a condition key.
        context = {} if call.namespace is None else {"cloudwatch:namespace": call.namespace}
        return [IamRequest(f"cloudwatch:{call.operation}", "*", context, call=described)]
    raise ValueError(f"no IAM mapping for service {call.service!r}")


# A transaction is authorized item by item, as the single-item action of each part.
TRANSACTION_PART_ACTIONS = {
    "Put": "dynamodb:PutItem",
    "Update": "dynamodb:UpdateItem",
    "Delete": "dynamodb:DeleteItem",
    "ConditionCheck": "dynamodb:ConditionCheckItem",
}


def _dynamodb_requests(call: RecordedCall, prefix: str, described: str) -> list[IamRequest]:
    if call.operation == "TransactWriteItems":
        return [
            IamRequest(TRANSACTION_PART_ACTIONS[kind], f"{prefix}:table/{table}", call=described)
            for kind, table in dict.fromkeys(call.transaction)
        ]
    if not call.tables:
        return [IamRequest(f"dynamodb:{call.operation}", "*", call=described)]
    requests = []
    for table in call.tables:
        resource = f"{prefix}:table/{table}" + (f"/index/{call.index}" if call.index else "")
        requests.append(IamRequest(f"dynamodb:{call.operation}", resource, call=described))
        if call.operation == "CreateTable" and "Tags" in call.parameters:
            # Tagging on creation is authorized as TagResource on the new table as well.
            requests.append(IamRequest("dynamodb:TagResource", f"{prefix}:table/{table}", call=described))
    return requests


def _glue_requests(call: RecordedCall, prefix: str, described: str) -> list[IamRequest]:
    if "CatalogId" in call.parameters:
        raise ValueError(f"a Glue call with a CatalogId (another account's catalog) is not modelled: {described}")
    resources = [f"{prefix}:catalog"]
    if call.database is not None:
        resources.append(f"{prefix}:database/{call.database}")
    resources.extend(f"{prefix}:table/{call.database}/{table}" for table in call.tables)
    if call.operation in GLUE_LISTINGS:
        resources.append(f"{prefix}:{GLUE_LISTINGS[call.operation].format(database=call.database)}")
    return [IamRequest(f"glue:{call.operation}", resource, call=described) for resource in resources]


def _s3_requests(call: RecordedCall, described: str) -> list[IamRequest]:
    if call.bucket is None:
        action = "s3:ListAllMyBuckets" if call.operation == "ListBuckets" else f"s3:{call.operation}"
        return [IamRequest(action, "*", call=described)]
    bucket = f"arn:aws:s3:::{call.bucket}"
    if call.key is not None:
        action = S3_OBJECT_ACTIONS.get(call.operation, f"s3:{call.operation}")
        requests = [IamRequest(action, f"{bucket}/{call.key}", call=described)]
        if call.operation in S3_READS and call.status == 404:
            requests.append(IamRequest("s3:ListBucket", bucket, call=described))
        return requests
    action = S3_BUCKET_ACTIONS.get(call.operation, f"s3:{call.operation}")
    query = dict(call.query)
    context = {f"s3:{name}": query[name] for name in ("prefix", "delimiter", "max-keys") if name in query}
    if call.operation == "DeleteObjects":  # authorized key by key (its body's; every key when none was read)
        return [IamRequest(action, f"{bucket}/{key}", call=described) for key in call.keys or ("*",)]
    return [IamRequest(action, bucket, context if action == "s3:ListBucket" else {}, described)]


def _describe(call: RecordedCall) -> str:
    if call.service == "s3":
        target = "/".join(part for part in (call.bucket, call.key) if part)
        query = "&".join(f"{name}={value}" for name, value in call.query if name not in ("uploadId",))
        return f"s3 {call.operation} {call.method} /{target}{'?' + query if query else ''} -> {call.status}"
    names = [
        *call.tables,
        *([f"index {call.index}"] if call.index else []),
        *([f"stream {call.stream}"] if call.stream else []),
        *([f"database {call.database}"] if call.database else []),
    ]
    return f"{call.service} {call.operation} {', '.join(names)} -> {call.status}"


def as_named_in(template: Policy, policy: Policy, grants: Iterable[Grant]) -> set[Grant]:
    """`policy`'s `grants` as `template` names them: `policy` is the same document (or some of its
    statements) with its placeholders replaced, `template` with them kept, so that grants used by runs
    with different names (applications, tables) can be compared."""
    templates = {statement.sid: statement for statement in template.statements}
    names: dict[Grant, Grant] = {}
    for statement in policy.statements:
        original = templates[statement.sid]
        for kind, values, patterns in (
            ("action", statement.actions, original.actions),
            ("resource", statement.resources, original.resources),
        ):
            names.update(
                {
                    Grant(statement.sid, kind, value): Grant(statement.sid, kind, pattern)
                    for value, pattern in zip(values, patterns, strict=True)
                }
            )
    return {names[grant] for grant in grants}
