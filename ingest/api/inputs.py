"""Request bodies read by DRF serializers: JSON objects, fields copied per request."""

from __future__ import annotations

import copy
from typing import Any

import orjson
from rest_framework import serializers

from ingest.api.errors import ApiError
from ingest.schema import EventError, check_nesting


class FlatInput(serializers.Serializer):
    """An input serializer of plain fields whose declared fields are copied, not rebuilt, per request.

    DRF deep-copies every declared field for every serializer instance, and a field's deepcopy is
    a new field built from its arguments (validators and all): a fifth of a claim's server CPU. A
    shallow copy is enough for plain fields, which hold no per-request state until they are bound
    (to the copy).
    """

    def get_fields(self) -> dict[str, serializers.Field]:
        return {name: copy.copy(field) for name, field in self._declared_fields.items()}


def parse_input(serializer_class, request) -> dict[str, Any]:
    try:
        data = orjson.loads(request.body or b"null")
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, "invalid_json", f"body: not valid JSON ({exc})", field="body") from None
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_body", "body: must be a JSON object", field="body")
    # The limit of trace events holds for every JSON body (a claim's args, a result): past it the
    # serializers' and orjson's recursions fail (docs/limits.md).
    try:
        for name, value in data.items():
            check_nesting(value, str(name))
    except EventError as exc:
        raise ApiError(400, "invalid", str(exc), field=exc.field) from None
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data
