"""Draw the DFlash Chat icon with Qt and turn it into the platform's icon files.

The icon is drawn from code (QPainter vector paths, no fonts, no bitmaps from elsewhere): a
rounded square with a diagonal indigo-to-teal gradient, a white speech bubble, and an amber
lightning bolt in the bubble (chat + "flash").

Outputs:
    packaging/icon/dflash_chat.png       1024x1024 RGBA source image (committed)
    --iconset DIR                        the macOS iconset PNG set (16..512 @1x/@2x), the
                                         multi-size PNG set used on every platform
    --icns FILE                          an Apple icon file; made with ``iconutil`` on macOS
                                         when available, otherwise written directly (PNG
                                         payloads in ICNS ``ic07``..``ic14`` entries)

Run: ``python packaging/make_icon.py [--iconset DIR] [--icns FILE] [--source PNG]``.
Needs only PySide6 (QtGui); runs with ``QT_QPA_PLATFORM=offscreen`` on a machine with no display.

Sources: the iconset file names and sizes follow Apple's "Human Interface Guidelines: App icons"
and ``man iconutil``; the ICNS container layout (``b"icns"`` + big-endian u32 total length,
then entries of 4-byte type + big-endian u32 length including the 8-byte header) and the type
codes for PNG payloads (ic07=128, ic08=256, ic09=512, ic10=1024 (512@2x), ic11=32 (16@2x),
ic12=64 (32@2x), ic13=256 (128@2x), ic14=512 (256@2x)) are from the Apple Icon Image format
description (https://en.wikipedia.org/wiki/Apple_Icon_Image_format).
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE_PNG = HERE / "icon" / "dflash_chat.png"
SOURCE_SIZE = 1024

# (file name in the .iconset, pixel size); Apple's iconset naming.
ICONSET_ENTRIES: list[tuple[str, int]] = [
    ("icon_16x16.png", 16),
    ("icon_16x16@2x.png", 32),
    ("icon_32x32.png", 32),
    ("icon_32x32@2x.png", 64),
    ("icon_128x128.png", 128),
    ("icon_128x128@2x.png", 256),
    ("icon_256x256.png", 256),
    ("icon_256x256@2x.png", 512),
    ("icon_512x512.png", 512),
    ("icon_512x512@2x.png", 1024),
]

# ICNS element types that carry a PNG payload, with their pixel size.
ICNS_PNG_TYPES: list[tuple[bytes, int]] = [
    (b"ic11", 32),
    (b"ic12", 64),
    (b"ic07", 128),
    (b"ic08", 256),
    (b"ic13", 256),
    (b"ic09", 512),
    (b"ic14", 512),
    (b"ic10", 1024),
]


def _gui_app():
    """A QGuiApplication (offscreen when there is no display); reuses a running one."""
    from PySide6.QtGui import QGuiApplication

    app = QGuiApplication.instance()
    if app is None:
        if sys.platform.startswith("linux") and not (
            os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
        ):
            os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
        app = QGuiApplication([sys.argv[0]])
    return app


def render_icon(size: int = SOURCE_SIZE):
    """Draw the icon at ``size`` x ``size`` pixels.

    Returns a ``QImage`` (Format_ARGB32_Premultiplied, transparent outside the rounded square).
    The drawing is in a 1024-unit coordinate system scaled to ``size``; the rounded square
    leaves a 100-unit margin as in Apple's macOS icon grid (824-unit body, 185-unit corner).
    Raises ValueError for ``size < 16``.
    """
    if size < 16:
        raise ValueError(f"icon size must be at least 16 px, got {size}")
    _gui_app()
    from PySide6.QtCore import QPointF, QRectF, Qt
    from PySide6.QtGui import QColor, QImage, QLinearGradient, QPainter, QPainterPath, QPolygonF

    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    p = QPainter(image)
    p.setRenderHint(QPainter.RenderHint.Antialiasing, True)
    p.scale(size / 1024.0, size / 1024.0)

    # Body: rounded square with a diagonal gradient.
    body = QRectF(100, 100, 824, 824)
    grad = QLinearGradient(body.topLeft(), body.bottomRight())
    grad.setColorAt(0.0, QColor("#3b2f9e"))
    grad.setColorAt(1.0, QColor("#0f9b8e"))
    p.setPen(Qt.PenStyle.NoPen)
    p.setBrush(grad)
    p.drawRoundedRect(body, 185, 185)

    # Speech bubble: rounded rectangle plus a tail at the lower left.
    bubble = QPainterPath()
    bubble.addRoundedRect(QRectF(210, 240, 604, 440), 120, 120)
    tail = QPainterPath()
    tail.addPolygon(QPolygonF([QPointF(300, 620), QPointF(260, 800), QPointF(450, 660)]))
    bubble = bubble.united(tail)
    p.setBrush(QColor("#ffffff"))
    p.drawPath(bubble)

    # Lightning bolt inside the bubble.
    bolt = QPolygonF(
        [
            QPointF(560, 280),
            QPointF(400, 480),
            QPointF(500, 480),
            QPointF(450, 640),
            QPointF(630, 420),
            QPointF(525, 420),
            QPointF(590, 280),
        ]
    )
    p.setBrush(QColor("#f5a623"))
    p.drawPolygon(bolt)
    p.end()
    return image


def _load_source(source: Path):
    """The source PNG as a QImage; ValueError when it cannot be read or is not square."""
    _gui_app()
    from PySide6.QtGui import QImage

    image = QImage(str(source))
    if image.isNull():
        raise ValueError(f"cannot read icon source image {source}")
    if image.width() != image.height():
        raise ValueError(f"icon source must be square, got {image.width()}x{image.height()}")
    return image


def _png_bytes(image, size: int) -> bytes:
    """``image`` scaled (smooth) to ``size`` px, encoded as PNG bytes."""
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt

    if image.width() != size:
        image = image.scaled(
            size,
            size,
            Qt.AspectRatioMode.IgnoreAspectRatio,
            Qt.TransformationMode.SmoothTransformation,
        )
    data = QByteArray()
    buf = QBuffer(data)
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    if not image.save(buf, "PNG"):
        raise RuntimeError("Qt could not encode a PNG")
    buf.close()
    return bytes(data.data())


def write_source(path: Path = SOURCE_PNG) -> Path:
    """Render the 1024 px source image to ``path`` (folders created); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(_png_bytes(render_icon(SOURCE_SIZE), SOURCE_SIZE))
    return path


def write_iconset(out_dir: Path, source: Path = SOURCE_PNG) -> list[Path]:
    """Write the ten iconset PNGs (see ``ICONSET_ENTRIES``) scaled from ``source``.

    Returns the written paths. Raises ValueError when ``source`` is unreadable or not square.
    """
    image = _load_source(source)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, size in ICONSET_ENTRIES:
        target = out_dir / name
        target.write_bytes(_png_bytes(image, size))
        written.append(target)
    return written


def icns_bytes(source: Path = SOURCE_PNG) -> bytes:
    """An ICNS file (PNG payloads, types in ``ICNS_PNG_TYPES``) built from ``source``."""
    image = _load_source(source)
    chunks = []
    for kind, size in ICNS_PNG_TYPES:
        payload = _png_bytes(image, size)
        chunks.append(kind + struct.pack(">I", len(payload) + 8) + payload)
    body = b"".join(chunks)
    return b"icns" + struct.pack(">I", len(body) + 8) + body


def write_icns(out: Path, source: Path = SOURCE_PNG, use_iconutil: bool | None = None) -> Path:
    """Write an ``.icns`` for ``source`` to ``out``; returns ``out``.

    ``use_iconutil`` None means: use Apple's ``iconutil`` when on macOS and it is on PATH,
    else write the container directly with :func:`icns_bytes`.
    Raises subprocess.CalledProcessError if iconutil fails.
    """
    if use_iconutil is None:
        use_iconutil = sys.platform == "darwin" and shutil.which("iconutil") is not None
    out.parent.mkdir(parents=True, exist_ok=True)
    if use_iconutil:
        with tempfile.TemporaryDirectory() as tmp:
            iconset = Path(tmp) / "DFlashChat.iconset"
            write_iconset(iconset, source)
            subprocess.run(
                ["iconutil", "--convert", "icns", "--output", str(out), str(iconset)],
                check=True,
            )
    else:
        out.write_bytes(icns_bytes(source))
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line; see the module docstring. Returns 0."""
    parser = argparse.ArgumentParser(description="Render the DFlash Chat icon files.")
    parser.add_argument("--source", type=Path, default=SOURCE_PNG, help="source PNG path")
    parser.add_argument(
        "--render", action="store_true", help="(re)draw the source PNG from code first"
    )
    parser.add_argument("--iconset", type=Path, help="write the multi-size PNG set here")
    parser.add_argument("--icns", type=Path, help="write an .icns file here")
    args = parser.parse_args(argv)
    if args.render or not args.source.exists():
        print(f"drew {write_source(args.source)}")
    if args.iconset:
        print(f"wrote {len(write_iconset(args.iconset, args.source))} PNGs to {args.iconset}")
    if args.icns:
        print(f"wrote {write_icns(args.icns, args.source)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
