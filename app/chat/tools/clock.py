"""The ``current_time`` tool: the current local time in an IANA time zone, via :mod:`zoneinfo`.

Zone data comes from the system or from the ``tzdata`` package (a dependency, so the frozen
macOS app has it too). Names are IANA names (``Europe/Paris``, ``America/New_York``) or
``UTC``; a name is matched case-insensitively. City names that are not IANA keys are refused.
"""

from __future__ import annotations

import datetime as _dt
import functools
import re
import zoneinfo

from app.chat.tools.base import ToolError

_KEY = re.compile(r"^[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+){0,2}$")


NOT_ZONES = frozenset({"localtime", "posixrules", "factory"})
"""Files of the zone database that are not time zones a user means: ``localtime`` (the
machine's own setting, not an IANA name), ``posixrules`` and ``Factory`` (no local time,
"-00") are refused as unknown (case-folded names)."""


@functools.lru_cache(maxsize=1)
def _zones_by_folded_name() -> dict[str, str]:
    zones = {z.casefold(): z for z in zoneinfo.available_timezones()
             if z.casefold() not in NOT_ZONES}
    zones.setdefault("utc", "UTC")
    return zones


def resolve_zone(name: str) -> zoneinfo.ZoneInfo:
    """The :class:`zoneinfo.ZoneInfo` for an IANA ``name`` (case-insensitive) or ``UTC``.

    Raises :class:`ToolError` for an empty, malformed or unknown name.
    """
    text = name.strip().replace(" ", "_") if isinstance(name, str) else ""
    if not text:
        raise ToolError("the time zone is empty; give an IANA name such as 'Europe/Paris' or 'UTC'")
    if not _KEY.match(text):
        raise ToolError(f"'{name:.60}' is not an IANA time zone name (e.g. 'Asia/Tokyo', 'UTC')")
    key = _zones_by_folded_name().get(text.casefold())
    if key is None:
        raise ToolError(
            f"unknown time zone '{name:.60}'; use an IANA name such as 'America/New_York' or 'UTC'"
        )
    try:
        return zoneinfo.ZoneInfo(key)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise ToolError(f"unknown time zone '{name:.60}'") from None


def _offset_text(offset: _dt.timedelta | None) -> str:
    minutes = int((offset or _dt.timedelta(0)).total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    minutes = abs(minutes)
    return f"{sign}{minutes // 60:02d}:{minutes % 60:02d}"


def current_time(timezone: str, now: _dt.datetime | None = None) -> dict:
    """Tool entry point: the time now in ``timezone``.

    ``now``: an aware datetime to report instead of the clock (tests). Returns
    ``{"timezone", "datetime" (ISO 8601 with offset, seconds), "date" (YYYY-MM-DD),
    "time" (HH:MM:SS), "weekday" (English name), "utc_offset" ("+HH:MM"), "abbreviation"}``.
    Raises :class:`ToolError` for an unknown zone.
    """
    zone = resolve_zone(timezone)
    moment = (now or _dt.datetime.now(_dt.UTC)).astimezone(zone).replace(microsecond=0)
    return {
        "timezone": zone.key,
        "datetime": moment.isoformat(),
        "date": moment.date().isoformat(),
        "time": moment.strftime("%H:%M:%S"),
        "weekday": moment.strftime("%A"),
        "utc_offset": _offset_text(moment.utcoffset()),
        "abbreviation": moment.tzname() or "",
    }


PARAMETERS = {
    "type": "object",
    "properties": {
        "timezone": {
            "type": "string",
            "description": 'An IANA time zone name such as "Europe/Paris", "Asia/Tokyo" or '
            '"America/New_York", or "UTC". City names that are not IANA names are not '
            "accepted.",
        }
    },
    "required": ["timezone"],
}
DESCRIPTION = (
    "Get the current date, time, weekday and UTC offset in a time zone (IANA names or UTC)."
)
