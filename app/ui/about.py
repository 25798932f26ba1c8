"""About box: versions, licences (Qt's LGPL among them, the demo pair's card) and
"Copy debug info". Versions come from package metadata (``importlib.metadata``), so the GUI
thread never imports ``mlx``; the MLX device is reported by the worker after loading.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version

from PySide6 import __version__ as pyside_version
from PySide6.QtCore import qVersion
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QPushButton,
    QTabWidget,
    QTextBrowser,
    QVBoxLayout,
)

from app import APP_NAME, __version__

LICENCES = """\
<p><b>DFlash Chat</b> — MIT licence.</p>
<p><b>Qt 6 / PySide6</b> — used under the GNU Lesser General Public License v3 (LGPL-3.0).
Qt's source is available from <a href="https://download.qt.io/">download.qt.io</a>; PySide6
is dynamically linked and can be replaced by the user.</p>
<p><b>MLX</b>, <b>mlx-lm</b> — MIT licence (Apple Inc.).</p>
<p><b>transformers</b>, <b>huggingface_hub</b>, <b>tokenizers</b>, <b>safetensors</b> —
Apache-2.0 (Hugging Face).</p>
<p><b>qasync</b> — BSD-2-Clause. <b>NumPy</b> — BSD-3-Clause. <b>pint</b> — BSD-3-Clause.</p>
<p><b>DFlash</b> — the algorithm is from Chen et al. 2026, “DFlash: Block Diffusion for Flash
Speculative Decoding”.</p>
"""


def _pkg(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def versions() -> dict[str, str]:
    """Versions of the app and the libraries it runs on (str -> str)."""
    return {
        APP_NAME: __version__,
        "Python": sys.version.split()[0],
        "Qt": qVersion(),
        "PySide6": pyside_version,
        "mlx": _pkg("mlx"),
        "mlx-lm": _pkg("mlx-lm"),
        "transformers": _pkg("transformers"),
        "huggingface_hub": _pkg("huggingface_hub"),
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
    }


def blas_in_use() -> str:
    """The BLAS library MLX uses, as ``app.engine.blas`` sees it without importing MLX (the
    worker reports the loaded one after a model loads)."""
    if sys.platform == "darwin":
        return "Accelerate (Apple)"
    try:
        from app.engine.blas import blas_description

        return blas_description(load_mlx=False)
    except Exception:  # the module is optional for the window
        pre = os.environ.get("DFLASH_BLAS_PRELOADED") or os.environ.get("LD_PRELOAD")
        return pre or "the mlx-cpu wheel's bundled reference BLAS"


def debug_info(extra: dict | None = None) -> str:
    """Plain-text debug report: versions, MLX device, BLAS, model paths (``extra``)."""
    extra = dict(extra or {})
    lines = [f"{k}: {v}" for k, v in versions().items()]
    lines.append(f"BLAS: {extra.pop('BLAS', None) or blas_in_use()}")
    for k, v in extra.items():
        lines.append(f"{k}: {v}")
    return "\n".join(lines)


class AboutDialog(QDialog):
    """Tabs: About (versions), Licences, Demo model card; a "Copy debug info" button."""

    def __init__(self, extra: dict | None = None, card: str = "", parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"About {APP_NAME}")
        self.resize(560, 460)
        self.info = debug_info(extra)
        head = QLabel(f"<h2>{APP_NAME} {__version__}</h2>"
                      "<p>Chat with local MLX models, with plain decoding or exact DFlash "
                      "speculative decoding, side by side.</p>")
        head.setWordWrap(True)
        tabs = QTabWidget()
        ver = QTextBrowser()
        ver.setPlainText(self.info)
        ver.setAccessibleName("Versions")
        lic = QTextBrowser()
        lic.setOpenExternalLinks(True)
        lic.setHtml(LICENCES)
        lic.setAccessibleName("Licences")
        model = QTextBrowser()
        model.setAccessibleName("Model card")
        if card:
            model.setMarkdown(card)
        else:
            model.setPlainText("No model card: the loaded model has no README.md.")
        tabs.addTab(ver, "Versions")
        tabs.addTab(lic, "Licences")
        tabs.addTab(model, "Model card")
        copy = QPushButton("Copy debug info")
        copy.setAccessibleName("Copy debug info")
        copy.clicked.connect(self.copy_debug_info)
        buttons = QDialogButtonBox(QDialogButtonBox.Close)
        buttons.addButton(copy, QDialogButtonBox.ActionRole)
        buttons.rejected.connect(self.reject)
        buttons.accepted.connect(self.accept)
        lay = QVBoxLayout(self)
        lay.addWidget(head)
        lay.addWidget(tabs)
        lay.addWidget(buttons)

    def copy_debug_info(self) -> None:
        """Put the debug report on the clipboard."""
        QGuiApplication.clipboard().setText(self.info)
