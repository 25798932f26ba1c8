"""What the frozen build keeps and leaves out; read by dflash_chat.spec and packaging/hooks/.

Plain data, no PyInstaller imports, so tests can read it too.
"""

# mlx-lm model families the engine supports: mlx_lm.utils._get_classes imports
# ``mlx_lm.models.<model_type>`` by name at load time, so each is a hidden import.
MLX_LM_FAMILIES = ["qwen3_5", "qwen3_5_moe", "qwen3_next", "qwen3", "llama"]

# transformers.models.<name> folders kept in the bundle: the configuration and tokenizer
# classes the supported checkpoints name (Qwen3.5/Qwen3-Next/Qwen3 tokenizers are
# ``Qwen2Tokenizer``; Llama/Mistral use ``LlamaTokenizer``), plus ``auto`` (AutoTokenizer,
# AutoConfig). transformers' package __init__ files import every model under TYPE_CHECKING,
# which PyInstaller would otherwise follow into ~560 model folders.
HF_FAMILIES = ["qwen2", "qwen3", "qwen3_5", "qwen3_5_moe", "qwen3_next", "llama"]
HF_KEEP = ["auto", *HF_FAMILIES]

# Python packages not needed at run time (smaller, faster build).
EXCLUDES = [
    "torch",
    "torchvision",
    "torchaudio",
    "tensorflow",
    "flax",
    "jax",
    "keras",
    "matplotlib",
    "PIL",
    "tkinter",
    "_tkinter",
    "IPython",
    "jupyter",
    "notebook",
    "pytest",
    "_pytest",
    "pytestqt",
    "ruff",
    "PyInstaller",
    "setuptools",
    "pip",
    "pandas",
    "scipy",
    "sklearn",
    "datasets",
    "accelerate",
    "av",
    "cv2",
    "librosa",
    "soundfile",
    "sentencepiece",
    "timm",
    "mistral_common",
    "numba",
    "sympy",
    "tests",
    "tools",
]

# Qt modules the app does not use (it needs QtCore, QtGui, QtWidgets, and QtNetwork for
# QLocalServer, all in PySide6-Essentials). tests/test_frozen_build.py checks app/ imports none.
QT_EXCLUDES = [
    "PySide6.QtQml",
    "PySide6.QtQuick",
    "PySide6.QtQuickWidgets",
    "PySide6.QtQuickControls2",
    "PySide6.QtQuick3D",
    "PySide6.QtPdf",
    "PySide6.QtPdfWidgets",
    "PySide6.QtSql",
    "PySide6.QtTest",
    "PySide6.QtDesigner",
    "PySide6.QtUiTools",
    "PySide6.QtHelp",
    "PySide6.QtMultimedia",
    "PySide6.QtMultimediaWidgets",
    "PySide6.QtWebEngineCore",
    "PySide6.QtWebEngineWidgets",
    "PySide6.QtWebChannel",
    "PySide6.QtWebSockets",
    "PySide6.QtOpenGL",
    "PySide6.QtOpenGLWidgets",
    "PySide6.QtXml",
    "PySide6.QtConcurrent",
    "PySide6.QtDBus",
    "PySide6.QtSvg",
    "PySide6.QtSvgWidgets",
    "PySide6.QtPrintSupport",
    "PySide6.QtStateMachine",
    "PySide6.QtCharts",
    "PySide6.QtDataVisualization",
    "PySide6.QtGraphs",
]


def hf_model_closure(models_dir: str) -> set[str]:
    """``HF_KEEP`` plus every model folder its non-modeling modules import, transitively.

    ``models_dir`` is the installed ``transformers/models`` folder. Imports are found by
    parsing each ``.py`` file except ``modeling_*``/``modular_*`` (which need torch and are
    not bundled): ``from ..<name>`` and ``transformers.models.<name>``. For example
    ``auto/tokenization_auto.py`` imports ``encoder_decoder``'s config.
    """
    import ast
    import os

    keep: set[str] = set()
    todo = list(HF_KEEP)
    while todo:
        name = todo.pop()
        folder = os.path.join(models_dir, name)
        if name in keep or not os.path.isdir(folder):
            continue
        keep.add(name)
        for entry in os.scandir(folder):
            if not entry.name.endswith(".py") or entry.name.startswith(("modeling_", "modular_")):
                continue
            with open(entry.path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if not isinstance(node, ast.ImportFrom) or not node.module:
                    continue
                if node.level == 2:
                    todo.append(node.module.split(".")[0])
                elif node.level == 0 and node.module.startswith("transformers.models."):
                    todo.append(node.module.split(".")[2])
    return keep


def _installed_hf_models_dir() -> str | None:
    import importlib.util

    spec = importlib.util.find_spec("transformers.models")
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def hf_kept_models() -> set[str]:
    """The model folders the bundle keeps (:func:`hf_model_closure` of the installed ones)."""
    root = _installed_hf_models_dir()
    return hf_model_closure(root) if root else set()


def excluded_hf_model_packages() -> list[str]:
    """``transformers.models.<name>`` for every installed model folder not kept.

    Empty when transformers is not installed. Used by packaging/hooks as ``excludedimports``.
    """
    import os

    root = _installed_hf_models_dir()
    if root is None:
        return []
    keep = hf_model_closure(root)
    names = sorted(
        entry.name
        for entry in os.scandir(root)
        if entry.is_dir() and not entry.name.startswith("_") and entry.name not in keep
    )
    return [f"transformers.models.{name}" for name in names]
