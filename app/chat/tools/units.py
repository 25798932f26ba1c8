"""The ``convert_units`` tool: unit conversion through `pint <https://pint.readthedocs.io>`_.

Units are parsed by pint's own parser (no ``eval``) from its default registry: lengths, masses,
volumes, times, speeds, temperatures (``degC``/``celsius``, ``degF``/``fahrenheit``,
``kelvin``; offset units are converted as absolute temperatures), energies, pressures, data
sizes and so on. Currencies are not units (no network).
"""

from __future__ import annotations

import math
import re
import threading

from app.chat.tools.base import ToolError

MAX_UNIT_CHARS = 64
SIGNIFICANT_DIGITS = 10
MAX_VALUE = 1.7976931348623157e308
"""The largest value that can be converted (the largest float)."""
"""Converted values are rounded to this many significant digits."""

_UNIT_TEXT = re.compile(r"^[A-Za-z0-9_ /*^.\-\u00b0\u00b5\u03bc\u00b2\u00b3]+$")
_EXPONENT = re.compile(r"\*\*|\^")
_SMALL_POWER = re.compile(r"^\s*[+-]?\d{1,2}(?![\d.])(?!\s*(\*\*|\^))")
_ALIASES = {
    "c": "degC",
    "°c": "degC",
    "celsius": "degC",
    "degrees celsius": "degC",
    "degree celsius": "degC",
    "centigrade": "degC",
    "f": "degF",
    "°f": "degF",
    "fahrenheit": "degF",
    "degrees fahrenheit": "degF",
    "degree fahrenheit": "degF",
    "k": "kelvin",
    "degrees kelvin": "kelvin",
    "kph": "km/h",
    "kmh": "km/h",
    "km/hr": "km/h",
    "mph": "mile/hour",
    "mpg": "mile/gallon",
    "°": "degree",
}
_lock = threading.Lock()
_registry = None


def registry():
    """The shared :class:`pint.UnitRegistry`, built once on first use (0.5-1 s on a 2-core
    CPU; :func:`build_in_background` takes that cost before the first conversion)."""
    global _registry
    with _lock:
        if _registry is None:
            import pint

            _registry = pint.UnitRegistry(autoconvert_offset_to_baseunit=True)
        return _registry


def build_in_background() -> threading.Thread | None:
    """Build :func:`registry` in a daemon thread, so that the first ``convert_units`` call
    of a session does not pay for it (a conversion that comes first waits for the build).
    Returns the thread, or None when the registry is already built."""
    if _registry is not None:
        return None
    thread = threading.Thread(target=registry, name="unit-registry", daemon=True)
    thread.start()
    return thread


def _unit_text(text: str, which: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise ToolError(f"{which} is empty")
    text = " ".join(text.split())
    if len(text) > MAX_UNIT_CHARS or not _UNIT_TEXT.match(text):
        raise ToolError(f"{which} '{text:.40}' is not a unit name")
    # pint evaluates numbers inside unit text exactly, so "10**10**10 m" would run for ever:
    # an exponent may only follow a unit name and must be a small number, used once.
    for match in _EXPONENT.finditer(text):
        before = text[: match.start()].rstrip()
        after = text[match.end() :]
        if not before or not (before[-1].isalpha() or before[-1] == "_"):
            raise ToolError(f"{which} '{text:.40}': a power must follow a unit name")
        if not _SMALL_POWER.match(after):
            raise ToolError(f"{which} '{text:.40}': powers must be small whole numbers")
    return _ALIASES.get(text.casefold(), text.replace("°C", "degC").replace("°F", "degF"))


def _parse_unit(ureg, text: str, which: str):
    import pint

    try:
        return ureg.parse_units(text)
    except (pint.errors.UndefinedUnitError, pint.errors.DefinitionSyntaxError):
        pass
    except Exception:  # pint's parser raises several plain errors for odd text
        pass
    # Plurals and spaced names: "miles", "square meters", "kilometers per hour".
    alt = text.replace(" per ", "/").replace("square ", "sq_").replace("cubic ", "cubic_")
    alt = alt.replace(" ", "_")
    try:
        return ureg.parse_units(alt)
    except Exception:
        raise ToolError(f"unknown unit '{text:.40}'") from None


def convert_units(value: float, from_unit: str, to_unit: str) -> dict:
    """Tool entry point: convert ``value`` ``from_unit`` into ``to_unit``.

    Returns ``{"value": float|int (10 significant digits), "unit": pint's long name (e.g.
    "mile"), "symbol": the short form (e.g. "mi")}``. Raises :class:`ToolError` for an
    unknown unit, units of different dimensions, or a non-finite value.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ToolError("value must be a finite number")
    try:
        value = float(value)
    except OverflowError:  # an int beyond float's range, e.g. 10**400
        raise ToolError(f"value is too large to convert (at most about {MAX_VALUE:.3g})"
                        ) from None
    if not math.isfinite(value):
        raise ToolError("value must be a finite number")
    src = _unit_text(from_unit, "from_unit")
    dst = _unit_text(to_unit, "to_unit")
    ureg = registry()
    import pint

    u_src = _parse_unit(ureg, src, "from_unit")
    u_dst = _parse_unit(ureg, dst, "to_unit")
    _check_above_absolute_zero(ureg, value, u_src, from_unit)
    try:
        converted = ureg.Quantity(value, u_src).to(u_dst)
    except pint.errors.DimensionalityError:
        raise ToolError(
            f"cannot convert {from_unit.strip()} ({_dims(u_src)}) to {to_unit.strip()} "
            f"({_dims(u_dst)})"
        ) from None
    except pint.errors.OffsetUnitCalculusError as exc:
        raise ToolError(f"cannot convert these temperature units: {exc}") from None
    magnitude = float(converted.magnitude)
    if not math.isfinite(magnitude):
        raise ToolError("the result is not a finite number")
    if str(converted.dimensionality) == "[temperature]":
        # Offset scales go through kelvin, which leaves noise such as 5.7e-14 degC for 32 degF.
        magnitude = round(magnitude, 9)
    out = float(f"{magnitude:.{SIGNIFICANT_DIGITS}g}")
    if out.is_integer() and abs(out) < 2**53:
        out = int(out)
    return {"value": out, "unit": f"{converted.units:P}", "symbol": f"{converted.units:~P}"}


def _check_above_absolute_zero(ureg, value: float, unit, name: str) -> None:
    """Refuse a temperature below absolute zero (a temperature difference, ``delta_degC``,
    may be negative).

    Raises:
        ToolError: naming the value and absolute zero on the common scales.
    """
    if str(unit.dimensionality) != "[temperature]" or "delta" in str(unit):
        return
    kelvin = float(ureg.Quantity(value, unit).to("kelvin").magnitude)
    if kelvin < -1e-9:
        raise ToolError(f"{value:g} {name.strip()} is below absolute zero (0 K, -273.15 °C, "
                        "-459.67 °F): no temperature is lower")


def _dims(unit) -> str:
    dims = str(unit.dimensionality)
    return "dimensionless" if dims in ("", "dimensionless") else dims


PARAMETERS = {
    "type": "object",
    "properties": {
        "value": {"type": "number", "description": "The amount to convert, e.g. 5."},
        "from_unit": {
            "type": "string",
            "description": 'The unit of the value, e.g. "km", "mile", "kg", "degC", '
            '"fahrenheit", "liter", "mph".',
        },
        "to_unit": {"type": "string", "description": 'The unit to convert to, e.g. "mile".'},
    },
    "required": ["value", "from_unit", "to_unit"],
}
DESCRIPTION = (
    "Convert a value between units of the same kind (length, mass, volume, temperature, "
    "speed, time, area, energy, pressure, data size). Not for currencies."
)
