"""Built-in tools, the tool runner, tool files and the ``tools`` CLI (issue 5)."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from app.chat.tools import (
    BUILTIN_TOOLS,
    Tool,
    ToolError,
    ToolFileError,
    ToolResult,
    load_tool_file,
    run_tool,
    tool_schemas,
)
from app.chat.tools.calculator import evaluate
from app.chat.tools.clock import current_time
from app.chat.tools.countries import load_countries, normalize_name
from app.cli import main as cli_main

REPO = Path(__file__).resolve().parent.parent
GUARD_S = 5.0  # generous: every hostile input must fail by itself, long before this


# --------------------------------------------------------------------------- schemas


def test_builtin_names_order_and_openai_shape():
    assert [t.name for t in BUILTIN_TOOLS] == [
        "calculator",
        "current_time",
        "convert_units",
        "country_info",
    ]
    schemas = tool_schemas()
    assert [s["function"]["name"] for s in schemas] == [t.name for t in BUILTIN_TOOLS]
    required = {
        "calculator": ["expression"],
        "current_time": ["timezone"],
        "convert_units": ["value", "from_unit", "to_unit"],
        "country_info": ["name"],
    }
    for s in schemas:
        assert s["type"] == "function"
        fn = s["function"]
        assert set(fn) == {"name", "description", "parameters"}
        assert fn["description"]
        assert fn["parameters"]["type"] == "object"
        assert fn["parameters"]["required"] == required[fn["name"]]
        assert set(fn["parameters"]["properties"]) == set(required[fn["name"]])
        json.dumps(s)  # the template serialises it
    assert schemas[2]["function"]["parameters"]["properties"]["value"]["type"] == "number"
    assert all(t.builtin and t.func is not None for t in BUILTIN_TOOLS)


# --------------------------------------------------------------------------- calculator


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("17*23", 391),
        ("2^10", 1024),
        ("2**10", 1024),
        ("(2 + 3) * 4", 20),
        ("-3**2", -9),
        ("10/4", 2.5),
        ("10/2", 5),
        ("7//2", 3),
        ("7 % 3", 1),
        ("0.1 + 0.2", 0.3),
        ("sqrt(16) + 1", 5),
        ("sqrt(2)", 1.41421356237),
        ("factorial(10)", 3628800),
        ("round(pi, 2)", 3.14),
        ("log(8, 2)", 3),
        ("log(e)", 1),
        ("log10(1000)", 3),
        ("floor(-2.5) + ceil(2.1)", 0),
        ("abs(-7.5)", 7.5),
        ("2**-2", 0.25),
        ("sin(0) + cos(0)", 1),
        ("2**1000 // 2**999", 2),
        ("3 \u00d7 4 \u00f7 2", 6),
        ("min(3.5)", 3.5),
        ("max(2, 7, -1)", 7),
    ],
)
def test_calculator_values(expression, expected):
    result = run_tool("calculator", {"expression": expression})
    assert result.ok, result.error
    assert result.result == pytest.approx(expected, rel=1e-11)
    if isinstance(expected, int):
        assert isinstance(result.result, int)


def test_calculator_big_exact_int():
    assert evaluate("2**100") == 1267650600228229401496703205376
    assert evaluate("factorial(25)") == 15511210043330985984000000


@pytest.mark.parametrize(
    "expression, fragment",
    [
        ("__import__('os')", "not allowed"),
        ("__import__('os').system('echo hi')", "not allowed"),
        ("(1).__class__", "not allowed"),
        ("().__class__.__bases__[0].__subclasses__()", "not allowed"),
        ("[x for x in range(10)]", "not allowed"),
        ("(lambda: 1)()", "not allowed"),
        ("9**9**9**9", "too large"),
        ("10**400", "too large"),
        ("0.5**-5000", "too large"),
        ("factorial(100000)", "factorial is limited"),
        ("factorial(-1)", "non-negative"),
        ("factorial(2.5)", "whole number"),
        ("[1]*10**9", "not allowed"),
        ("'a'*10**9", "only numbers"),
        ("1+" * 400 + "1", "longer than"),
        ("-" * 400 + "1", "parts"),
        ("(" * 240 + "1" + ")" * 240, "not a valid"),
        ("1/0", "division by zero"),
        ("1 % 0", "division by zero"),
        ("5 // 0", "division by zero"),
        ("0**-1", "division by zero"),
        ("sqrt(-1)", "negative"),
        ("log(0)", "positive"),
        ("exp(1000)", "too large"),
        ("1e308 * 10", "too large"),
        ("(-8)**(1/3)", "complex"),
        ("x + 1", "unknown name"),
        ("True + 1", "only numbers"),
        ("1 if 1 else 2", "not allowed"),
        ("1 < 2", "not allowed"),
        ("6 & 3", "not allowed"),
        ("open('/etc/passwd')", "not allowed"),
        ("sqrt(x=4)", "positional"),
        ("sqrt(1, 2)", "takes 1"),
        ("2 +", "not a valid"),
        ("", "empty"),
        ("1j * 2", "only numbers"),
    ],
)
def test_calculator_hostile_inputs_fail_fast(expression, fragment):
    start = time.perf_counter()
    result = run_tool("calculator", {"expression": expression}, timeout_s=GUARD_S)
    assert not result.ok
    assert "timed out" not in result.error
    assert fragment in result.error, result.error
    assert result.error.startswith("calculator")
    assert time.perf_counter() - start < GUARD_S


def test_calculator_parenthesis_depth_limit():
    # Nesting below the parser's limit is fine; deeper nesting is refused (hostile cases).
    result = run_tool("calculator", {"expression": "(" * 90 + "2" + ")" * 90}, timeout_s=GUARD_S)
    assert result.ok and result.result == 2


# --------------------------------------------------------------------------- current_time


def test_current_time_fixed_instants():
    summer = dt.datetime(2024, 7, 1, 12, 0, 0, tzinfo=dt.UTC)  # a Monday
    r = current_time("America/New_York", now=summer)
    assert r == {
        "timezone": "America/New_York",
        "datetime": "2024-07-01T08:00:00-04:00",
        "date": "2024-07-01",
        "time": "08:00:00",
        "weekday": "Monday",
        "utc_offset": "-04:00",
        "abbreviation": "EDT",
    }
    winter = dt.datetime(2024, 1, 14, 23, 30, 0, tzinfo=dt.UTC)  # Sunday in UTC
    r = current_time("europe/paris", now=winter)  # case-insensitive
    assert r["timezone"] == "Europe/Paris"
    assert r["datetime"] == "2024-01-15T00:30:00+01:00"
    assert r["weekday"] == "Monday"
    assert r["abbreviation"] == "CET"
    r = current_time("Asia/Kolkata", now=winter)
    assert r["utc_offset"] == "+05:30" and r["time"] == "05:00:00"
    assert current_time("utc", now=winter)["utc_offset"] == "+00:00"


def test_current_time_through_runner_is_now():
    r = run_tool("current_time", {"timezone": "UTC"})
    assert r.ok, r.error
    stamp = dt.datetime.fromisoformat(r.result["datetime"])
    assert abs((dt.datetime.now(dt.UTC) - stamp).total_seconds()) < 60
    assert r.result["timezone"] == "UTC"


@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "Paris", "../../etc/passwd", "  ", "EST5",
                                  "localtime", "posixrules", "Factory"])
def test_current_time_unknown_zone(zone):
    r = run_tool("current_time", {"timezone": zone})
    assert not r.ok
    assert "zone" in r.error


# --------------------------------------------------------------------------- convert_units


def test_convert_units_values():
    r = run_tool("convert_units", {"value": 5, "from_unit": "km", "to_unit": "mile"})
    assert r.ok, r.error
    assert r.result["value"] == pytest.approx(5 / 1.609344, rel=1e-9)
    assert r.result["unit"] == "mile" and r.result["symbol"] == "mi"
    r = run_tool("convert_units", {"value": 100, "from_unit": "celsius", "to_unit": "fahrenheit"})
    assert r.ok and r.result["value"] == 212
    r = run_tool("convert_units", {"value": "32", "from_unit": "°F", "to_unit": "degC"})
    assert r.ok and r.result["value"] == 0  # numeric string coerced
    r = run_tool("convert_units", {"value": 1, "from_unit": "kg", "to_unit": "pound"})
    assert r.result["value"] == pytest.approx(1 / 0.45359237, rel=1e-9)
    r = run_tool("convert_units", {"value": 3, "from_unit": "miles", "to_unit": "kilometers"})
    assert r.result["value"] == pytest.approx(3 * 1.609344, rel=1e-9)
    r = run_tool("convert_units", {"value": 90, "from_unit": "km/h", "to_unit": "m/s"})
    assert r.result["value"] == 25
    r = run_tool("convert_units", {"value": 2, "from_unit": "m^2", "to_unit": "cm**2"})
    assert r.result["value"] == 20000 and r.result["symbol"] == "cm²"


@pytest.mark.parametrize(
    "args, fragment",
    [
        ({"value": 1, "from_unit": "kg", "to_unit": "meter"}, "cannot convert"),
        ({"value": 1, "from_unit": "blorbs", "to_unit": "meter"}, "unknown unit"),
        ({"value": 1, "from_unit": "__import__('os')", "to_unit": "m"}, "not a unit"),
        ({"value": "five", "from_unit": "km", "to_unit": "m"}, "must be a number"),
        ({"value": True, "from_unit": "km", "to_unit": "m"}, "must be a number"),
        ({"value": 1, "from_unit": "", "to_unit": "m"}, "empty"),
        # pint computes numbers in unit text exactly: these would run for ever unrefused
        ({"value": 1, "from_unit": "10**10**10 m", "to_unit": "m"}, "must follow a unit name"),
        ({"value": 1, "from_unit": "m", "to_unit": "m**10**10"}, "small whole numbers"),
        ({"value": 1, "from_unit": "m^2^2", "to_unit": "m"}, "small whole numbers"),
        ({"value": 1, "from_unit": "(10)**99", "to_unit": "m"}, "not a unit name"),
        ({"value": 1e308, "from_unit": "km", "to_unit": "nm"}, "not a finite number"),
        ({"value": 10**400, "from_unit": "m", "to_unit": "km"}, "too large"),
        ({"value": -10**400, "from_unit": "m", "to_unit": "km"}, "too large"),
        # no temperature is below absolute zero (0 K, -273.15 °C, -459.67 °F)
        ({"value": -300, "from_unit": "degC", "to_unit": "kelvin"}, "below absolute zero"),
        ({"value": -1, "from_unit": "kelvin", "to_unit": "degC"}, "below absolute zero"),
        ({"value": -500, "from_unit": "fahrenheit", "to_unit": "celsius"},
         "below absolute zero"),
    ],
)
def test_convert_units_errors(args, fragment):
    r = run_tool("convert_units", args, timeout_s=GUARD_S)
    assert not r.ok
    assert "timed out" not in r.error
    assert fragment in r.error, r.error
    assert "Error" not in r.error  # a sentence, not an exception's name


def test_temperatures_down_to_absolute_zero_and_differences_convert():
    r = run_tool("convert_units", {"value": -273.15, "from_unit": "degC", "to_unit": "kelvin"})
    assert r.ok and r.result["value"] == 0
    r = run_tool("convert_units", {"value": -459.67, "from_unit": "degF", "to_unit": "degC"})
    assert r.ok and r.result["value"] == -273.15
    # a temperature difference may be negative
    r = run_tool("convert_units", {"value": -10, "from_unit": "delta_degC",
                                   "to_unit": "delta_degF"})
    assert r.ok and r.result["value"] == -18


# --------------------------------------------------------------------------- country_info


def test_country_info_lookup():
    r = run_tool("country_info", {"name": "France"})
    assert r.ok
    assert r.result["capital"] == "Paris"
    assert r.result["continent"] == "Europe"
    assert r.result["currency"] == {"name": "Euro", "code": "EUR"}
    assert r.result["languages"] == ["French"]
    assert isinstance(r.result["population"], int) and r.result["population_year"] == 2023
    assert "aliases" not in r.result
    assert run_tool("country_info", {"name": "usa"}).result["name"] == "United States"
    assert run_tool("country_info", {"name": "The Netherlands"}).result["capital"] == "Amsterdam"
    assert run_tool("country_info", {"name": "cote d'ivoire"}).result["name"] == "Ivory Coast"
    assert run_tool("country_info", {"name": "  JAPAN "}).result["currency"]["code"] == "JPY"


def test_country_info_unknown():
    r = run_tool("country_info", {"name": "Atlantis"})
    assert not r.ok and "no country named 'Atlantis'" in r.error
    assert len(r.error) < 200
    r = run_tool("country_info", {"name": "Frnace"})
    assert not r.ok and "did you mean France" in r.error


def test_country_data_is_clean():
    records = load_countries()
    assert len(records) >= 180
    continents = {"Africa", "Asia", "Europe", "North America", "South America", "Oceania"}
    keys: dict[str, str] = {}
    for rec in records:
        assert set(rec) == {
            "name",
            "capital",
            "continent",
            "currency",
            "languages",
            "population",
            "population_year",
            "aliases",
        }, rec["name"]
        assert rec["continent"] in continents
        assert rec["capital"].strip() == rec["capital"] and rec["capital"]
        code = rec["currency"]["code"]
        assert len(code) == 3 and code.isalpha() and code.isupper()
        assert rec["currency"]["name"]
        assert rec["languages"] and all(isinstance(x, str) and x for x in rec["languages"])
        assert isinstance(rec["population"], int) and 100 <= rec["population"] < 2_000_000_000
        assert rec["population_year"] == 2023
        for name in [rec["name"], *rec["aliases"]]:  # no name or alias is ambiguous
            key = normalize_name(name)
            assert keys.setdefault(key, rec["name"]) == rec["name"], name
    assert len({r["name"] for r in records}) == len(records)


# --------------------------------------------------------------------------- runner


def test_unknown_tool():
    r = run_tool("weather", {"city": "Paris"})
    assert not r.ok
    assert "unknown tool 'weather'" in r.error and "calculator" in r.error


@pytest.mark.parametrize(
    "name, args, fragment",
    [
        ("calculator", {}, "missing required argument 'expression'"),
        ("calculator", {"expression": "1", "mode": "x"}, "unexpected argument 'mode'"),
        ("calculator", {"expression": 391}, "'expression' must be a string"),
        ("calculator", ["1+1"], "must be an object"),
        ("calculator", "{not json", "not a JSON object"),
        ("country_info", {"name": None}, "'name' must be a string"),
        ("convert_units", {"value": [1], "from_unit": "m", "to_unit": "km"}, "must be a number"),
        ("convert_units", {"value": "nan", "from_unit": "m", "to_unit": "km"}, "must be a number"),
    ],
)
def test_wrong_arguments(name, args, fragment):
    r = run_tool(name, args)
    assert not r.ok
    assert fragment in r.error, r.error
    assert r.duration_s >= 0


def test_arguments_as_json_text():
    r = run_tool("calculator", '{"expression": "6*7"}')
    assert r.ok and r.result == 42


def _custom(func, name="custom", params=None):
    params = params or {"type": "object", "properties": {"n": {"type": "integer"}}}
    return Tool(name=name, description="test tool", parameters=params, func=func, builtin=False)


def test_tool_that_raises_and_tool_error():
    def boom(n=0):
        raise RuntimeError("disk on fire")

    def picky(n=0):
        raise ToolError("n must be even")

    r = run_tool("custom", {"n": 1}, tools=[_custom(boom)])
    assert not r.ok and r.error == "custom failed: RuntimeError: disk on fire"
    r = run_tool("custom", {"n": 1}, tools=[_custom(picky)])
    assert not r.ok and r.error == "custom: n must be even"


def test_integer_coercion_and_rejection():
    seen = []
    tools = [_custom(lambda n=0: seen.append(n) or n * 2)]
    assert run_tool("custom", {"n": "21"}, tools=tools).result == 42
    assert run_tool("custom", {"n": 4.0}, tools=tools).result == 8
    assert seen == [21, 4] and all(type(v) is int for v in seen)
    r = run_tool("custom", {"n": 2.5}, tools=tools)
    assert not r.ok and "must be an integer" in r.error


def test_timeout():
    release = threading.Event()

    def slow(n=0):
        release.wait(30)
        return n

    start = time.perf_counter()
    r = run_tool("custom", {"n": 1}, tools=[_custom(slow)], timeout_s=0.3)
    elapsed = time.perf_counter() - start
    release.set()
    assert not r.ok and r.error == "custom timed out after 0.3 s"
    assert elapsed < 10  # returned at the timeout, not when the tool finished


def test_non_json_result():
    r = run_tool("custom", {}, tools=[_custom(lambda n=0: {1, 2})])
    assert not r.ok and "not JSON" in r.error


def test_declared_tool_without_implementation():
    tool = Tool(name="send_email", description="", parameters={"type": "object"}, builtin=False)
    r = run_tool("send_email", {}, tools=[*BUILTIN_TOOLS, tool])
    assert not r.ok and r.error == "tool send_email has no implementation in this app"


def test_tool_result_payload():
    assert ToolResult(True, result=391).to_payload() == {"ok": True, "result": 391}
    assert json.loads(ToolResult(False, error="bad").content()) == {"ok": False, "error": "bad"}
    assert ToolResult(True, result="Zürich").content() == '{"ok": true, "result": "Zürich"}'


# --------------------------------------------------------------------------- tool files


def test_load_tool_file(tmp_path):
    path = tmp_path / "tools.json"
    path.write_text(
        json.dumps(
            [
                {
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "description": "Weather for a city",
                        "parameters": {
                            "type": "object",
                            "properties": {"city": {"type": "string"}},
                            "required": ["city"],
                        },
                    },
                },
                {"name": "ping"},
            ]
        )
    )
    tools = load_tool_file(path)
    assert [t.name for t in tools] == ["get_weather", "ping"]
    assert all(not t.builtin and t.func is None for t in tools)
    assert tools[0].parameters["required"] == ["city"]
    assert tools[1].parameters == {"type": "object", "properties": {}}
    assert tool_schemas(tools)[0]["function"]["description"] == "Weather for a city"
    r = run_tool("get_weather", {"city": "Oslo"}, tools=[*BUILTIN_TOOLS, *tools])
    assert r.error == "tool get_weather has no implementation in this app"


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("[{]", "not valid JSON"),
        ('{"name": "x"}', "JSON list"),
        ('[{"name": "bad name"}]', "name must be"),
        ('[{"name": "a"}, {"name": "a"}]', "duplicate"),
        ('[{"name": "a", "parameters": {"type": "array"}}]', "type object"),
        ('[{"name": "a", "parameters": {"properties": {"x": 1}}}]', "properties"),
        ('[{"name": "a", "description": 5}]', "description"),
        ("[42]", "expected an object"),
    ],
)
def test_bad_tool_files(tmp_path, text, fragment):
    path = tmp_path / "t.json"
    path.write_text(text)
    with pytest.raises(ToolFileError) as info:
        load_tool_file(path)
    assert fragment in str(info.value) and str(path) in str(info.value)


def test_missing_tool_file(tmp_path):
    with pytest.raises(ToolFileError, match="not found"):
        load_tool_file(tmp_path / "nope.json")


# --------------------------------------------------------------------------- CLI


def test_cli_list(capsys):
    assert cli_main(["tools"]) == 0
    out = capsys.readouterr().out
    for tool in BUILTIN_TOOLS:
        assert f"{tool.name}(" in out
    assert "value: number" in out
    assert cli_main(["tools", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == tool_schemas()


def test_cli_run(capsys):
    assert cli_main(["tools", "run", "calculator", "--args", '{"expression": "17*23"}']) == 0
    assert json.loads(capsys.readouterr().out) == {"ok": True, "result": 391}
    assert cli_main(["tools", "run", "calculator", "--args", '{"expression": "9**9**9**9"}']) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and "too large" in out["error"]
    assert cli_main(["tools", "run", "country_info", "--args", '{"name": "Japan"}']) == 0
    assert json.loads(capsys.readouterr().out)["result"]["capital"] == "Tokyo"


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["tools", "run", "weather", "--args", "{}"], "unknown tool 'weather'"),
        (["tools", "run", "calculator", "--args", "{expression"], "not valid JSON"),
        (["tools", "run", "calculator", "--args", "[1]"], "JSON object"),
    ],
)
def test_cli_run_usage_errors(capsys, argv, fragment):
    assert cli_main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert fragment in captured.err


def test_cli_subprocess_prints_391():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "app",
            "tools",
            "run",
            "calculator",
            "--args",
            '{"expression": "17*23"}',
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"ok": True, "result": 391}


def test_math_reference_values_are_independent():
    # The expected values above come from arithmetic, not from the module under test;
    # spot-check the two irrational ones against math directly.
    assert evaluate("sqrt(2)") == pytest.approx(math.sqrt(2), rel=1e-11)
    assert evaluate("round(pi, 2)") == 3.14
