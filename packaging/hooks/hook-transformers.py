"""PyInstaller hook for transformers, used instead of pyinstaller-hooks-contrib's.

Like the contrib hook it collects the distribution metadata transformers checks at import time
(``transformers.dependency_versions_table.deps``, for the dists installed here) and keeps the
``.py`` sources beside the bytecode ("pyz+py"): ``transformers.utils.import_utils`` builds its
lazy import structure by scanning model folders for ``.py`` files on disk. Unlike it, the model
folders the app never loads are excluded (see ``bundle_lists.HF_KEEP``); transformers'
``__init__`` imports all of them under ``TYPE_CHECKING``, which analysis would follow.
"""

from bundle_lists import excluded_hf_model_packages
from PyInstaller.utils.hooks import copy_metadata, get_module_attribute, is_module_satisfies

datas = []
try:
    _deps = get_module_attribute("transformers.dependency_versions_table", "deps")
except Exception:  # an unexpected transformers layout: fall back to no extra metadata
    _deps = {}
for _name, _requirement in _deps.items():
    try:
        if is_module_satisfies(_requirement):
            datas += copy_metadata(_name)
    except Exception:
        pass

module_collection_mode = "pyz+py"
excludedimports = excluded_hf_model_packages() + ["transformers.models.timm_wrapper"]
