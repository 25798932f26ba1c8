"""Entry script of the frozen app (PyInstaller runs this as ``__main__``).

It only hands over to :func:`app.__main__.main`, the same entry point as ``python -m app``, so
the frozen and unfrozen apps parse the same arguments and find resources the same way
(:func:`app.paths.resources_dir` looks in ``sys._MEIPASS`` when frozen).
"""

import multiprocessing
import sys

from app.__main__ import main

if __name__ == "__main__":
    multiprocessing.freeze_support()
    sys.exit(main())
