"""PyInstaller hook for transformers.models: keep only the model folders in HF_KEEP.

``transformers/models/__init__.py`` imports every model package under ``TYPE_CHECKING``;
analysis would follow all of them. The app loads only the families in
``bundle_lists.HF_FAMILIES`` (their configs and tokenizers) and ``auto``.
"""

from bundle_lists import excluded_hf_model_packages

excludedimports = excluded_hf_model_packages()
module_collection_mode = "pyz+py"
