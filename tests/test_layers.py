"""The package's import structure: engine <- models <- chat <- serve <- ui / commands, and no
cycles.

Every ``import app.x`` / ``from app.x import y`` in ``app/`` is read with :mod:`ast`, lazy
imports inside functions included (they run too, just later).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "app"

LAYER = {"paths": 0, "engine": 1, "models": 2, "chat": 3, "serve": 4, "ui": 5, "commands": 5,
         "cli": 6, "__main__": 6}
"""Higher layers may import lower ones only; ui and commands do not import each other. The
server (``serve``) sits on chat: ``commands.serve`` runs it and the window may serve its
loaded pair through it."""


def module_name(path: Path) -> str:
    rel = path.relative_to(APP.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """The ``app`` modules ``path`` imports (``from app.x import y`` counts as ``app.x.y`` when
    that is a module, else ``app.x``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for n in names:
            if n == "app" or n.startswith("app."):
                out.add(n)
    return out


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in APP.rglob("*.py")}
    g: dict[str, set[str]] = {}
    for mod, path in files.items():
        deps = set()
        for n in imports_of(path):
            while n not in files and "." in n:
                n = n.rsplit(".", 1)[0]
            if n in files and n != mod and n != "app":
                deps.add(n)
        g[mod] = deps
    return g


def layer(mod: str) -> int | None:
    parts = mod.split(".")
    return LAYER.get(parts[1]) if len(parts) > 1 else None


def test_imports_go_one_way():
    wrong = []
    for mod, deps in graph().items():
        lm = layer(mod)
        if lm is None:
            continue
        for d in deps:
            ld = layer(d)
            if ld is None:
                continue
            sibling = lm == ld == LAYER["ui"] and mod.split(".")[1] != d.split(".")[1]
            if ld > lm or sibling:
                wrong.append(f"{mod} -> {d}")
    assert wrong == [], "upward imports:\n" + "\n".join(sorted(wrong))


def test_engine_chat_and_serve_never_import_qt():
    qt = []
    for path in [p for pkg in ("engine", "chat", "serve") for p in (APP / pkg).rglob("*.py")]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(m.split(".")[0] in ("PySide6", "qasync") for m in mods):
                qt.append(module_name(path))
    assert qt == []


def test_no_import_cycle():
    g = graph()
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(g.get(m, ())):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m)
    assert cycles == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_walker_sees_imports():
    """The checks above would pass on an empty graph; make sure they read real edges."""
    g = graph()
    assert "app.engine.events" in g["app.chat.reply"]
    assert "app.chat.storage" in g["app.chat.turns"]
    assert "app.models.loader" in g["app.chat.session"]  # a lazy import inside a method
    assert layer("app.ui.window") == 5 and layer("app.engine.prefix") == 1
    assert layer("app.models.loader") == 2
    assert "app.chat.session" in g["app.serve.worker"]
    assert "app.serve.server" in g["app.commands.serve"]  # a lazy import inside a function
    assert layer("app.serve.api") == 4 and layer("app.commands.serve") == 5


def test_the_server_event_loop_never_imports_mlx():
    """MLX arrays belong to the thread that made them: only the worker (through the chat
    session) touches the engine; the API and server modules, which run on the event loop,
    import neither ``mlx`` nor the engine's decoding."""
    loop_side = ["app.serve.api", "app.serve.server", "app.serve.protocol"]
    g = graph()
    for mod in loop_side:
        path = APP / (mod.split(".", 1)[1].replace(".", "/") + ".py")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [n for n in names if n.split(".")[0] in ("mlx", "mlx_lm")], mod
        assert not {d for d in g[mod] if d.startswith(("app.engine.generate", "app.models",
                                                       "app.chat.session",
                                                       "app.chat.reply"))}, mod


def _ui_classes() -> dict[str, tuple[str, list[str], ast.ClassDef]]:
    """Every class defined in ``app/ui``: name -> (module, base names, node)."""
    out = {}
    for path in sorted((APP / "ui").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in node.bases]
                out[node.name] = (module_name(path), bases, node)
    return out


def test_the_window_is_composed_not_mixed():
    """The main window inherits only ``QMainWindow``; its controllers are objects it holds,
    and no class in ``app/ui`` mixes in another class of ``app/ui`` beside a Qt base."""
    classes = _ui_classes()
    assert classes["MainWindow"][1] == ["QMainWindow"]
    mixed = [f"{name}({', '.join(bases)})" for name, (_, bases, _) in classes.items()
             if len(bases) > 1]
    assert mixed == []
    assert not [n for n in classes if n.endswith("Flow")]  # the mixins are gone
    window = (APP / "ui" / "window.py").read_text(encoding="utf-8")
    for held in ("ReplyController(", "ModelController(", "TranscriptController(",
                 "ConversationController(", "ServeController(", "MessageBar("):
        assert held in window, held


def test_controllers_that_take_worker_signals_are_gui_qobjects():
    """A worker signal connected to a plain object's method runs on the worker's thread
    (no receiver to queue it for): every ``app/ui`` class that connects ``worker.<signal>``
    to its own methods is a ``QObject`` (it lives on the GUI thread, so the call queues)."""
    classes = _ui_classes()
    takers = []
    for name, (mod, bases, node) in classes.items():
        if mod == "app.ui.worker":
            continue
        src = ast.unparse(node)
        if re.search(r"\bworker\.\w+\.connect\(self\.", src):
            takers.append(name)
            assert bases and bases[0].startswith("Q"), f"{name}({', '.join(bases)})"
    assert {"ReplyController", "ModelController", "TranscriptController"} <= set(takers)


def test_each_controller_reads_only_what_it_was_given():
    """A window controller reads no attribute of ``self`` that it does not set itself (in its
    constructor: the widgets, the worker, the state and the other controllers it is given)
    or define: nothing is read off a window it is mixed into."""
    controllers = {name: node for name, (_, _, node) in _ui_classes().items()
                   if name.endswith("Controller") or name == "MessageBar"}
    assert len(controllers) >= 6
    unset = {}
    for name, node in controllers.items():
        own = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        own |= {t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets
                if isinstance(t, ast.Name)}
        sets, reads = set(), set()
        for n in ast.walk(node):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) \
                    and n.value.id == "self":
                (sets if isinstance(n.ctx, ast.Store) else reads).add(n.attr)
        if reads - sets - own:
            unset[name] = sorted(reads - sets - own)
    assert unset == {}


def test_consumers_import_event_types_from_the_one_event_namespace():
    """The window, the server and the CLIs take every event type from ``app.chat.events``:
    none from the engine's events module, and none of its names from the modules that emit
    them (the pipeline, the reply runner, the stored turn)."""
    from app.chat import events

    emitters = {"app.chat.pipeline", "app.chat.reply", "app.chat.stored_turn", "app.chat.turns",
                "app.chat.session"}
    wrong = []
    seen = 0
    for pkg in ("ui", "serve", "commands"):
        for path in (APP / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    wrong += [f"{module_name(path)}: import {a.name}" for a in node.names
                              if a.name == "app.engine.events"]
                if not isinstance(node, ast.ImportFrom) or not node.module:
                    continue
                names = {a.name for a in node.names}
                if node.module == "app.chat.events":
                    seen += len(names)
                elif node.module == "app.engine.events" or (
                        node.module in emitters and names & set(events.__all__)):
                    wrong.append(f"{module_name(path)}: from {node.module} import "
                                 f"{', '.join(sorted(names & set(events.__all__)) or names)}")
    assert wrong == []
    assert seen >= 20  # the walk found the consumers' event imports
    for name in ("TokenEvent", "Done", "ReplyDone", "TaggedEvent", "TurnStored"):
        assert name in events.__all__ and hasattr(events, name)
