"""Offline tools the model can call, and the runner that executes its calls (Qt-free).

Public API::

    Tool(name, description, parameters, func=None, builtin=True)   # frozen dataclass
    BUILTIN_TOOLS: list[Tool]       # calculator, current_time, convert_units, country_info
    builtin_tools(now=None) -> list[Tool]             # the same, current_time frozen at now
    tool_schemas(tools=BUILTIN_TOOLS) -> list[dict]   # OpenAI style function definitions
    load_tool_file(path) -> list[Tool]                # func None, builtin False; ToolFileError
    ToolResult(ok, result=None, error=None, duration_s=0.0)  # .to_payload(), .content()
    run_tool(name, arguments, tools=BUILTIN_TOOLS, timeout_s=10.0) -> ToolResult  # never raises
    ToolError       # raised inside tools for bad input, reported as ok=False

The names and schemas of the built-in tools are a contract: the bundled demo model was
trained to call exactly these. See docs/tools.md.
"""

from __future__ import annotations

import dataclasses as _dc
import datetime as _dt

from app.chat.tools import base as _base
from app.chat.tools import calculator as _calculator
from app.chat.tools import clock as _clock
from app.chat.tools import countries as _countries
from app.chat.tools import units as _units
from app.chat.tools.base import (
    Tool,
    ToolError,
    ToolFileError,
    ToolResult,
    check_arguments,
    find_tool,
    load_tool_file,
    run_tool,
    tool_schemas,
)

BUILTIN_TOOLS: list[Tool] = [
    Tool(
        name="calculator",
        description=_calculator.DESCRIPTION,
        parameters=_calculator.PARAMETERS,
        func=_calculator.calculator,
    ),
    Tool(
        name="current_time",
        description=_clock.DESCRIPTION,
        parameters=_clock.PARAMETERS,
        func=_clock.current_time,
    ),
    Tool(
        name="convert_units",
        description=_units.DESCRIPTION,
        parameters=_units.PARAMETERS,
        func=_units.convert_units,
    ),
    Tool(
        name="country_info",
        description=_countries.DESCRIPTION,
        parameters=_countries.PARAMETERS,
        func=_countries.country_info,
    ),
]
"""The tools that ship with the app, in the order they are shown to the model."""

BUILTIN_TOOL_NAMES: tuple[str, ...] = tuple(t.name for t in BUILTIN_TOOLS)


def builtin_tools(now: _dt.datetime | None = None) -> list[Tool]:
    """The built-in tools, with ``current_time`` reporting the aware datetime ``now`` instead
    of the clock (None: the clock, i.e. :data:`BUILTIN_TOOLS`). Two runs that must see the same
    tool results (plain and DFlash in a Compare) share one frozen instant."""
    if now is None:
        return list(BUILTIN_TOOLS)

    def frozen(timezone: str) -> dict:
        return _clock.current_time(timezone, now=now)

    return [_dc.replace(t, func=frozen) if t.name == "current_time" else t
            for t in BUILTIN_TOOLS]
_base.BUILTIN[:] = BUILTIN_TOOLS

__all__ = [
    "BUILTIN_TOOLS",
    "BUILTIN_TOOL_NAMES",
    "builtin_tools",
    "Tool",
    "ToolError",
    "ToolFileError",
    "ToolResult",
    "check_arguments",
    "find_tool",
    "load_tool_file",
    "run_tool",
    "tool_schemas",
]
