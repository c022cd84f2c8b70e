"""Template filters the pages share: times a browser shows in its own zone, durations as people say
them, stored values as JSON, long ids kept distinguishable."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from django import template
from django.utils.html import format_html

from dashboards.overview.charts import duration_text

register = template.Library()


@register.filter
def when(value: datetime | None, precision: str = "minutes") -> str:
    """A <time> in UTC that static/js/localtime.js rewrites in the viewer's time zone, with UTC kept in
    its title (what shows on hover). Without JavaScript it reads as UTC."""
    if value is None:
        return ""
    value = value.astimezone(UTC)
    shown = value.strftime("%Y-%m-%d %H:%M:%S" if precision == "seconds" else "%Y-%m-%d %H:%M")
    return format_html(
        '<time datetime="{}" data-local="{}" title="{} UTC">{} UTC</time>',
        value.strftime("%Y-%m-%dT%H:%M:%SZ"),
        precision,
        value.strftime("%Y-%m-%d %H:%M:%S"),
        shown,
    )


@register.filter
def duration(value: timedelta | None) -> str:
    """15 min, 3 h, 1 d — not 0:15:00."""
    return duration_text(value) if value is not None else ""


@register.filter
def as_json(value: Any) -> str:
    """A stored value as JSON (true, null, ["a"]), never as a Python repr (True, None, ['a'])."""
    if isinstance(value, str):
        return value
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return str(value)


@register.filter
def middle(value: str, length: int = 32) -> str:
    """A long id cut in the middle (start…end): run ids of one agent share their start, and what tells
    them apart is usually at the end."""
    text = str(value)
    if len(text) <= length:
        return text
    head = (length - 1) // 2
    tail = length - 1 - head
    return f"{text[:head]}…{text[-tail:]}"
