"""The worker's data converter: Temporal's default JSON payloads, decoded faster.

The SDK rebuilds a dataclass from JSON by resolving its field types with
`typing.get_type_hints` on every decode; in a busy worker (every step's activity inputs,
results and local-activity markers are dataclasses) that was about 5% of its CPU. This
converter resolves them once per class. Payloads are encoded as before, so clients and
workers with the default converter read and write the same bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any

from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultPayloadConverter,
    JSONPlainPayloadConverter,
    JSONTypeConverter,
    value_to_type,
)


@functools.cache
def _init_fields(cls: type) -> tuple[tuple[str, Any], ...] | None:
    """(name, type) of a dataclass's fields, or None where one is `init=False` (left to
    the SDK, which restores those after construction)."""
    fields = dataclasses.fields(cls)
    if any(not f.init for f in fields):
        return None
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in fields)


class CachedDataclassConverter(JSONTypeConverter):
    """A dataclass from a JSON object as the SDK builds it (fields missing from the
    object take their defaults, unknown keys are ignored), its field types cached."""

    def to_typed_value(self, hint: type, value: Any) -> Any:
        if not (isinstance(hint, type) and dataclasses.is_dataclass(hint)):
            return JSONTypeConverter.Unhandled
        fields = _init_fields(hint)
        if fields is None or not isinstance(value, dict):
            return JSONTypeConverter.Unhandled
        kwargs = {}
        for name, field_type in fields:
            if name in value:
                try:
                    kwargs[name] = value_to_type(field_type, value[name], [self])
                except Exception as err:
                    raise TypeError(f"Failed converting field {name} on dataclass {hint}") from err
        return hint(**kwargs)


class HeddlePayloadConverter(CompositePayloadConverter):
    """The default converters, the JSON one with cached dataclass fields."""

    def __init__(self) -> None:
        json_plain = JSONPlainPayloadConverter(custom_type_converters=[CachedDataclassConverter()])
        super().__init__(
            *(
                json_plain if isinstance(c, JSONPlainPayloadConverter) else c
                for c in DefaultPayloadConverter.default_encoding_payload_converters
            )
        )


DATA_CONVERTER = dataclasses.replace(
    DataConverter.default, payload_converter_class=HeddlePayloadConverter
)
