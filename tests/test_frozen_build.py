"""The frozen (PyInstaller) build: icon files, bundle contents, and the frozen binary running.

The slow tests build ``packaging/dflash_chat.spec`` once per session into a temporary folder
(on Linux a one-folder bundle; the macOS ``.app`` wrapping is behind a ``sys.platform`` guard in
the spec) and run the frozen executable offscreen: ``--version``, the built-in tools (pint,
tzdata and the bundled data files) and ``compare --json`` on the bundled demo pair. A module
missing from the hidden imports or a data file left out makes one of them fail.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import app
from app.paths import resources_dir

ROOT = Path(__file__).resolve().parent.parent
PACKAGING = ROOT / "packaging"
SPEC = PACKAGING / "dflash_chat.spec"
EXE_NAME = "dflash-chat"
DEMO_TARGET_CONFIG = ROOT / "resources" / "models" / "demo-target" / "config.json"

sys.path.insert(0, str(PACKAGING))
import bundle_lists  # noqa: E402
import make_icon  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Fast checks (no build)
# ---------------------------------------------------------------------------------------------
# Icon tests take pytest-qt's ``qapp`` so that make_icon reuses that QApplication instead of
# creating a QGuiApplication, which would break later widget tests in the same session.


def _png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk (PNG spec: signature, then IHDR first)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_icon_source_is_square_1024_with_transparent_corners(qapp):
    from PySide6.QtGui import QImage

    image = QImage(str(make_icon.SOURCE_PNG))
    assert not image.isNull()
    assert (image.width(), image.height()) == (1024, 1024)
    assert image.pixelColor(5, 5).alpha() == 0  # outside the rounded square
    assert image.pixelColor(512, 900).alpha() == 255  # body
    centre = image.pixelColor(330, 330)  # inside the white bubble
    assert (centre.red(), centre.green(), centre.blue()) == (255, 255, 255)


def test_iconset_has_every_apple_size(tmp_path, qapp):
    written = make_icon.write_iconset(tmp_path / "x.iconset")
    sizes = {p.name: _png_size(p.read_bytes()) for p in written}
    assert sizes["icon_16x16.png"] == (16, 16)
    assert sizes["icon_16x16@2x.png"] == (32, 32)
    assert sizes["icon_128x128.png"] == (128, 128)
    assert sizes["icon_256x256@2x.png"] == (512, 512)
    assert sizes["icon_512x512@2x.png"] == (1024, 1024)
    assert len(sizes) == 10


def test_icns_container_lists_png_entries_with_consistent_lengths(tmp_path, qapp):
    out = make_icon.write_icns(tmp_path / "a.icns", use_iconutil=False)
    data = out.read_bytes()
    assert data[:4] == b"icns"
    assert struct.unpack(">I", data[4:8])[0] == len(data)
    entries = {}
    pos = 8
    while pos < len(data):
        kind = data[pos : pos + 4]
        length = struct.unpack(">I", data[pos + 4 : pos + 8])[0]
        entries[kind] = _png_size(data[pos + 8 : pos + length])
        pos += length
    assert pos == len(data)
    assert entries[b"ic07"] == (128, 128)
    assert entries[b"ic10"] == (1024, 1024)
    assert entries[b"ic11"] == (32, 32)
    assert entries[b"ic14"] == (512, 512)


def test_icon_rejects_bad_sizes_and_sources(tmp_path, qapp):
    with pytest.raises(ValueError, match="at least 16"):
        make_icon.render_icon(8)
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a png")
    with pytest.raises(ValueError, match="cannot read"):
        make_icon.write_iconset(tmp_path / "y.iconset", source=bad)


def _imported_modules(package_dir: Path) -> set[str]:
    """Every absolute module name imported anywhere under ``package_dir`` (static)."""
    names: set[str] = set()
    for path in package_dir.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_app_imports_nothing_the_bundle_excludes():
    """A module the spec excludes but the app imports would only fail in the frozen app."""
    imported = _imported_modules(ROOT / "app")
    excluded = bundle_lists.EXCLUDES + bundle_lists.QT_EXCLUDES
    clashes = sorted(
        name for name in imported for ex in excluded if name == ex or name.startswith(ex + ".")
    )
    # matplotlib may be imported lazily by optional plot code; it is an extra, not bundled.
    clashes = [c for c in clashes if not c.startswith("matplotlib")]
    assert clashes == [], f"app imports modules excluded from the bundle: {clashes}"


def test_supported_families_exist_in_installed_mlx_lm_and_transformers():
    import importlib.util

    for fam in bundle_lists.MLX_LM_FAMILIES:
        assert importlib.util.find_spec(f"mlx_lm.models.{fam}") is not None, fam
    for fam in bundle_lists.HF_KEEP:
        assert importlib.util.find_spec(f"transformers.models.{fam}") is not None, fam
    kept = bundle_lists.hf_kept_models()
    # tokenization_auto imports EncoderDecoderConfig at module level: the closure must see it.
    assert {"auto", "encoder_decoder", "qwen2", "qwen3_5"} <= kept
    excluded = bundle_lists.excluded_hf_model_packages()
    assert "transformers.models.gemma" in excluded
    assert not any(e.endswith((".qwen2", ".auto", ".llama")) for e in excluded)


# Runs the spec in a separate interpreter with sys.platform "darwin" and recording stand-ins
# for PyInstaller's spec-file build classes; prints the recorded keyword arguments as JSON.
_SPEC_DRIVER = """
import json, sys
import PyInstaller.utils.hooks  # reads sys.platform on import: before the patch
calls = {}
class Built:
    pure = scripts = binaries = datas = ()
def recorder(kind):
    def record(*args, **kwargs):
        calls.setdefault(kind, []).append(kwargs)
        return Built()
    return record
spec, workpath = sys.argv[1], sys.argv[2]
names = ("Analysis", "PYZ", "EXE", "COLLECT", "BUNDLE")
spec_globals = {"__name__": "__main__", "__file__": spec, "workpath": workpath,
                "SPECPATH": spec.rsplit("/", 1)[0], "DISTPATH": workpath + "/dist",
                **{name: recorder(name) for name in names}}
sys.platform = "darwin"
exec(compile(open(spec).read(), spec, "exec"), spec_globals)
print(json.dumps(calls, default=str))
"""


def test_spec_on_macos_bundles_app_with_plist_and_icon(tmp_path):
    """Run the spec as PyInstaller would, with sys.platform "darwin" and recording stand-ins
    for Analysis/EXE/COLLECT/BUNDLE: the macOS branch (never run on this Linux CI) must make
    a BUNDLE with the Info.plist keys, a valid .icns, and the hidden imports and data."""
    pytest.importorskip("PyInstaller.utils.hooks", reason="PyInstaller is in the 'test' extra")
    proc = subprocess.run(
        [sys.executable, "-c", _SPEC_DRIVER, str(SPEC), str(tmp_path)],
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    calls = json.loads(proc.stdout.strip().splitlines()[-1])
    (bundle_kw,) = calls["BUNDLE"]
    assert bundle_kw["name"] == f"{app.APP_NAME}.app"
    assert bundle_kw["bundle_identifier"] == "ai.dflash.chat"
    plist = bundle_kw["info_plist"]
    assert plist["LSMinimumSystemVersion"] == "13.5"
    assert plist["NSHighResolutionCapable"] is True
    assert plist["CFBundleShortVersionString"] == app.__version__
    icns = Path(bundle_kw["icon"]).read_bytes()
    assert icns[:4] == b"icns" and struct.unpack(">I", icns[4:8])[0] == len(icns)

    (a_kw,) = calls["Analysis"]
    hidden = set(a_kw["hiddenimports"])
    for name in (
        "mlx_lm.models.qwen3_5",
        "mlx_lm.models.llama",
        "mlx_lm.tool_parsers.qwen3_coder",
        "app.commands.generation",
        "app.commands.chat",
        "app.commands.compare",
        "app.commands.models",
        "app.commands.bench",
        "app.commands.tools",
        "transformers.models.qwen2.tokenization_qwen2",
    ):
        assert name in hidden, name
    assert not any(".modeling_" in h for h in hidden if h.startswith("transformers."))
    dests = {(Path(src).name, dest) for src, dest in a_kw["datas"]}
    assert ("chat_template.jinja", "resources") in dests
    assert ("countries.json", str(Path("resources") / "data")) in dests
    (e_kw,) = calls["EXE"]
    assert e_kw["name"] == EXE_NAME and e_kw["console"] is False  # windowed on macOS
    assert e_kw["target_arch"] == "arm64"


# ---------------------------------------------------------------------------------------------
# The frozen build (slow; CI runs it)
# ---------------------------------------------------------------------------------------------


def _frozen_env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("PYTHONPATH", "PYTHONHOME", "DFLASH_RESOURCES", "VIRTUAL_ENV"):
        env.pop(key, None)
    env.update(
        QT_QPA_PLATFORM="offscreen",
        HF_HUB_OFFLINE="1",
        DFLASH_DATA_DIR=str(tmp / "data"),
        DFLASH_CACHE_DIR=str(tmp / "cache"),
        HF_HOME=str(tmp / "hf"),
        # No system zoneinfo: the bundled tzdata package must answer (zoneinfo reads this).
        PYTHONTZPATH="",
    )
    return env


def _build_env() -> dict[str, str]:
    """The PyInstaller run's environment: offscreen Qt, and no BLAS preload (``make test``
    preloads OpenBLAS; ``ldd`` would then list it for every library, and the bundle must not
    depend on what this machine preloads)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "DFLASH_BLAS_PRELOADED")}
    env["QT_QPA_PLATFORM"] = "offscreen"
    return env


@pytest.fixture(scope="session")
def frozen(tmp_path_factory):
    """Build the one-folder bundle once; returns (executable, bundle folder, scratch dir).

    ``DFLASH_FROZEN_DIST=<dist folder>`` reuses a bundle built earlier with this spec (for
    working on these tests); CI leaves it unset and builds.
    """
    tmp = tmp_path_factory.mktemp("frozen")
    reuse = os.environ.get("DFLASH_FROZEN_DIST")
    if reuse:
        bundle = Path(reuse) / app.APP_NAME
        return bundle / EXE_NAME, bundle, tmp
    pytest.importorskip("PyInstaller", reason="PyInstaller is in the 'test' extra")
    dist, work = tmp / "dist", tmp / "work"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "PyInstaller",
            "--noconfirm",
            "--distpath",
            str(dist),
            "--workpath",
            str(work),
            str(SPEC),
        ],
        cwd=tmp,
        env=_build_env(),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, (
        f"PyInstaller failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    )
    bundle = dist / app.APP_NAME
    exe = bundle / EXE_NAME
    assert exe.is_file() and os.access(exe, os.X_OK), f"no executable at {exe}"
    return exe, bundle, tmp


def _run(frozen, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    exe, _bundle, tmp = frozen
    return subprocess.run(
        [str(exe), *args],
        cwd=tmp,
        env=_frozen_env(tmp),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_frozen_version_reports_pinned_versions(frozen):
    proc = _run(frozen, "--version", timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"{app.APP_NAME} {app.__version__}"
    assert any(line.startswith(f"mlx {importlib.metadata.version('mlx')} ") for line in lines), (
        lines
    )
    assert f"mlx-lm {importlib.metadata.version('mlx-lm')}" in lines


@pytest.mark.slow
def test_frozen_bundle_contents(frozen):
    _exe, bundle, _tmp = frozen
    internal = bundle / "_internal"
    # Every resource file travels, byte for byte.
    src = resources_dir()
    for path in src.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            copy = internal / "resources" / path.relative_to(src)
            assert copy.is_file(), f"resource left out: {path.relative_to(src)}"
            assert copy.stat().st_size == path.stat().st_size
    # mlx's library sits in mlx/lib (the metallib is beside it on macOS).
    libdir = internal / "mlx" / "lib"
    libs = [p.name for p in libdir.iterdir()]
    assert any(n.startswith("libmlx") for n in libs), libs
    if sys.platform == "darwin":
        assert "mlx.metallib" in libs
    # Kept transformers model folders carry their config/tokenizer modules; every other one is
    # only its lazy __init__.py stub (AutoTokenizer imports some while searching for a class).
    models_dir = internal / "transformers" / "models"
    kept = bundle_lists.hf_kept_models()
    for name in kept:
        assert any((models_dir / name).glob("configuration_*.py")) or name == "auto", name
    assert (models_dir / "auto" / "tokenization_auto.py").is_file()
    stubs = [p for p in models_dir.iterdir() if p.is_dir() and p.name not in kept]
    assert len(stubs) > 100
    for stub in stubs:
        assert sorted(f.name for f in stub.iterdir()) == ["__init__.py"], stub.name
    assert (internal / "PySide6" / "Qt" / "plugins" / "platforms").is_dir()
    assert not (internal / "PySide6" / "Qt" / "translations").exists()
    for name in ("torch", "matplotlib", "PIL", "pytest"):
        assert not (internal / name).exists(), f"{name} should not be bundled"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("tool", "arguments", "check"),
    [
        ("calculator", {"expression": "17*23"}, lambda r: r == 391),
        # pint's unit definitions are data files: 1 mile = 1.609344 km (international mile).
        (
            "convert_units",
            {"value": 1, "from_unit": "mile", "to_unit": "km"},
            lambda r: abs(r["value"] - 1.609344) < 1e-9,
        ),
        # zoneinfo needs tzdata's files when the system has none: Tokyo is UTC+09:00, no DST.
        ("current_time", {"timezone": "Asia/Tokyo"}, lambda r: r["utc_offset"] == "+09:00"),
        # resources/data/countries.json must travel with the bundle.
        ("country_info", {"name": "Peru"}, lambda r: r["capital"] == "Lima"),
    ],
)
def test_frozen_tools_run(frozen, tool, arguments, check):
    proc = _run(frozen, "tools", "run", tool, "--args", json.dumps(arguments), timeout=120)
    assert proc.returncode == 0, proc.stderr
    payload = json.loads(proc.stdout.strip().splitlines()[-1])
    assert payload["ok"] is True, payload
    assert check(payload["result"]), payload


@pytest.mark.slow
@pytest.mark.skipif(
    not DEMO_TARGET_CONFIG.exists(),
    reason="the bundled demo pair (resources/models/demo-target) is not in this checkout yet",
)
def test_frozen_compare_on_bundled_pair_is_identical(frozen):
    """compare on the demo pair inside the bundle: plain == DFlash, and the frozen app's tokens
    are the unfrozen app's (so it really ran the bundled pair, not the tiny fallback)."""
    args = ["compare", "--json", "--max-tokens", "32"]
    proc = _run(frozen, *args, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tiny random-weight pair" not in proc.stderr  # compare's fallback when none is found
    result = json.loads(proc.stdout)
    assert result["identical"] is True, result
    plain, dflash = result["plain"], result["dflash"]
    assert len(plain["tokens"]) > 0
    assert plain["tokens"] == dflash["tokens"]

    _exe, _bundle, tmp = frozen
    unfrozen = subprocess.run(
        [sys.executable, "-m", "app", *args],
        cwd=ROOT,
        env=_frozen_env(tmp),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert unfrozen.returncode == 0, unfrozen.stderr[-3000:]
    assert json.loads(unfrozen.stdout)["plain"]["tokens"] == plain["tokens"]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3_5", "qwen3"])
def test_frozen_compare_on_tiny_pair_is_identical(frozen, tmp_path, family):
    """Loading (mlx-lm model module by name, transformers tokenizer classes) and both decoders
    in the frozen app, on a tiny random pair built here by the unfrozen engine. The tokenizer
    config names ``Qwen2Tokenizer`` as real Qwen checkpoints do."""
    from app.models.tiny import build_tiny_pair

    target, drafter = build_tiny_pair(tmp_path / "pair", family=family, seed=1)
    cfg_path = Path(target) / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "Qwen2Tokenizer"
    cfg_path.write_text(json.dumps(cfg))
    proc = _run(
        frozen,
        "compare",
        "--json",
        "--model",
        str(target),
        "--draft-model",
        str(drafter),
        "--max-tokens",
        "24",
        "--prompt",
        "Name three capitals.",
        "--tools",
        "none",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    plain, dflash = result["plain"], result["dflash"]
    assert len(plain["tokens"]) > 0
    assert plain["tokens"] == dflash["tokens"]
    assert result["identical"] is True


@pytest.mark.slow
def test_frozen_window_starts_and_keeps_one_instance(frozen, tmp_path, qapp):
    """The window (QtWidgets, QtNetwork, qasync, app.ui) starts in the frozen app, offscreen;
    a second launch on the same data folder finds it and exits instead of opening another."""
    import time

    from PySide6.QtNetwork import QLocalSocket

    from app.ui.main import server_name

    exe, _bundle, scratch = frozen
    data_dir = tmp_path / "gui-data"
    env = _frozen_env(scratch)
    first = subprocess.Popen(
        [str(exe), "--gui", "--data-dir", str(data_dir)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        connected = False
        while time.monotonic() < deadline and first.poll() is None:
            sock = QLocalSocket()
            sock.connectToServer(server_name(data_dir))
            connected = sock.waitForConnected(200)
            sock.abort()
            if connected:
                break
            time.sleep(0.5)
        assert first.poll() is None, f"the window exited early:\n{first.communicate()[1][-3000:]}"
        assert connected, "the window never started listening for a second instance"
        second = subprocess.run(
            [str(exe), "--gui", "--data-dir", str(data_dir)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 0, second.stderr[-3000:]
        assert "already running" in second.stdout
        assert first.poll() is None
        log_text = (data_dir / "dflash-chat.log").read_text(encoding="utf-8")
        assert f"starting {app.APP_NAME} {app.__version__}" in log_text
        assert "Traceback" not in log_text
    finally:
        first.terminate()
        try:
            first.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            first.kill()
            first.communicate()


# ---------------------------------------------------------------------------------------------
# packaging/build_macos.sh, run against stand-ins for Apple's tools (no Mac here)
# ---------------------------------------------------------------------------------------------

_FAKE_TOOLS = {
    # uname: a Mac on Apple Silicon.
    "uname": '[ "$1" = -m ] && echo arm64 || echo Darwin\n',
    # file: Mach-O when the file starts with the marker the fake build writes.
    "file": 'head -c 6 "$2" | grep -q MACHO && echo "Mach-O 64-bit dynamically linked shared '
    'library arm64" || echo data\n',
    "codesign": 'echo "codesign $*" >> "$CALLS"\n',
    "spctl": 'echo "spctl $*" >> "$CALLS"\n',
    "hdiutil": 'echo "hdiutil $*" >> "$CALLS"\nfor a; do last="$a"; done\ntouch "$last"\n',
    "ditto": 'echo "ditto $*" >> "$CALLS"\nif [ "$1" = -c ]; then touch "$5"; else '
    'cp -R "$1" "$2"; fi\n',
    "xcrun": 'echo "xcrun $*" >> "$CALLS"\nif [ "$1 $2" = "notarytool submit" ]; then '
    'echo \'{"id": "sub-1", "status": "Accepted"}\'; fi\n',
}

# The fake interpreter: pip is a no-op, PyInstaller lays out a small .app, anything else runs
# on the real interpreter.
_FAKE_PYTHON = """#!/usr/bin/env bash
if [ "$1 $2" = "-m pip" ]; then exit 0; fi
if [ "$1 $2" = "-m PyInstaller" ]; then
    echo "PyInstaller $*" >> "$CALLS"
    app="dist/DFlash Chat.app/Contents"
    mkdir -p "$app/MacOS" "$app/Frameworks/mlx/lib" "$app/Frameworks/QtCore.framework/Versions/A"
    printf 'MACHO\\n' > "$app/Frameworks/mlx/lib/libmlx.dylib"
    printf 'MACHO\\n' > "$app/Frameworks/QtCore.framework/Versions/A/QtCore"
    printf 'metal' > "$app/Frameworks/mlx/lib/mlx.metallib"
    printf 'text' > "$app/Frameworks/base_library.zip"
    {
        echo '#!/usr/bin/env bash'
        echo 'echo "app $*" >> "$CALLS"'
        echo 'if [ "$1" = compare ]; then echo "{\\"identical\\": true}"; else echo "DFlash Chat 0"; fi'
    } > "$app/MacOS/dflash-chat"
    chmod +x "$app/MacOS/dflash-chat"
    exit 0
fi
exec REAL_PYTHON "$@"
"""


def _run_build_script(tmp_path: Path, extra_env: dict[str, str]) -> tuple[int, str, list[str]]:
    """Run a copy of build_macos.sh in a scratch repo with stand-in tools on PATH.

    Returns (exit code, stdout+stderr, the recorded tool calls in order)."""
    repo = tmp_path / "repo"
    (repo / "packaging").mkdir(parents=True)
    (repo / "resources" / "models" / "demo-target").mkdir(parents=True)
    (repo / "resources" / "models" / "demo-target" / "config.json").write_text("{}")
    script = repo / "packaging" / "build_macos.sh"
    script.write_text((PACKAGING / "build_macos.sh").read_text())
    (repo / "packaging" / "entitlements.plist").write_text(
        (PACKAGING / "entitlements.plist").read_text()
    )
    venv_bin = repo / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").write_text(_FAKE_PYTHON.replace("REAL_PYTHON", sys.executable))
    (venv_bin / "python").chmod(0o755)
    tools = tmp_path / "tools"
    tools.mkdir()
    for name, body in _FAKE_TOOLS.items():
        (tools / name).write_text("#!/usr/bin/env bash\n" + body)
        (tools / name).chmod(0o755)
    calls = tmp_path / "calls.txt"
    calls.write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("DEVELOPER_ID", "NOTARY_PROFILE")}
    env.update(PATH=f"{tools}{os.pathsep}{env['PATH']}", CALLS=str(calls), **extra_env)
    proc = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    return proc.returncode, proc.stdout + proc.stderr, calls.read_text().splitlines()


def test_build_script_without_credentials_builds_unsigned_app_and_dmg(tmp_path):
    code, output, calls = _run_build_script(tmp_path, {})
    assert code == 0, output
    assert "UNSIGNED" in output
    assert not any(c.startswith(("codesign", "xcrun notarytool")) for c in calls), calls
    assert any(c.startswith("app compare --json") for c in calls)  # smoke test on the pair
    dmg = f"dist/DFlash-Chat-{app.__version__}.dmg"
    assert any(c.startswith("hdiutil create") and c.endswith(dmg) for c in calls), calls
    assert (tmp_path / "repo" / dmg).exists()


def test_build_script_signs_inside_out_then_notarizes_and_staples(tmp_path):
    identity = "Developer ID Application: Test (TEAM123456)"
    code, output, calls = _run_build_script(
        tmp_path, {"DEVELOPER_ID": identity, "NOTARY_PROFILE": "profile-x"}
    )
    assert code == 0, output
    signs = [c for c in calls if c.startswith("codesign --force")]
    targets = [c.rsplit(" ", 1)[-1] for c in signs]

    def index(suffix: str) -> int:
        return next(i for i, t in enumerate(targets) if t.endswith(suffix))

    # Leaves (Mach-O files) before their framework, the framework before the executable,
    # the executable before the app, the app before the DMG.
    assert index("libmlx.dylib") < index("QtCore.framework")
    assert index("Versions/A/QtCore") < index("QtCore.framework")
    assert index("QtCore.framework") < index("MacOS/dflash-chat") < index("Chat.app")
    assert index("Chat.app") < index(".dmg")
    assert not any(t.endswith(("base_library.zip", "mlx.metallib")) for t in targets)
    for line in signs:
        assert f"--sign {identity}" in line
        if not line.endswith(".dmg"):
            assert "--options runtime" in line and "--timestamp" in line
    for suffix in ("MacOS/dflash-chat", "Chat.app"):
        assert "--entitlements" in signs[index(suffix)]
    submits = [c for c in calls if c.startswith("xcrun notarytool submit")]
    assert len(submits) == 2 and submits[0].split()[3].endswith(".zip")
    assert all("--keychain-profile profile-x" in c and "--wait" in c for c in submits)
    staples = [c for c in calls if c.startswith("xcrun stapler staple")]
    assert staples[0].endswith("Chat.app") and staples[1].endswith(".dmg")
    assert "Signed, notarized and stapled" in output


def test_build_script_stops_when_notarization_is_rejected(tmp_path):
    saved = dict(_FAKE_TOOLS)
    try:
        _FAKE_TOOLS["xcrun"] = (
            'echo "xcrun $*" >> "$CALLS"\nif [ "$1 $2" = "notarytool submit" ]; then '
            'echo \'{"id": "sub-9", "status": "Invalid"}\'; fi\n'
        )
        code, output, calls = _run_build_script(
            tmp_path, {"DEVELOPER_ID": "Developer ID Application: T (X)", "NOTARY_PROFILE": "p"}
        )
    finally:
        _FAKE_TOOLS.clear()
        _FAKE_TOOLS.update(saved)
    assert code != 0
    assert "status 'Invalid'" in output and "sub-9" in output
    assert any(c.startswith("xcrun notarytool log sub-9") for c in calls)
    assert not any(c.startswith("xcrun stapler") for c in calls)
