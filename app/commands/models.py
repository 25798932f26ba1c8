"""``python -m app models``: list targets and DFlash drafters and which fit; add or forget a
model folder; download Hugging Face repos into the cache (``app.models.catalog`` and
``app.models.download`` do the work; this module only parses and prints)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from app.engine.errors import EngineError, ModelLoadError, ModelNotFoundError
from app.models.catalog import FOLDER_GONE, Catalog, catalog_report, format_bytes


def _print_text(report: dict) -> None:
    """The report of :func:`app.models.catalog.catalog_report` as text on stdout."""
    print(f"Hugging Face cache: {report['cache_dir']}")
    print("Targets:")
    if not report["targets"]:
        print("  (none)")
    for t in report["targets"]:
        print(f"  {t['name']}  [{t['source']}, {format_bytes(t['size_bytes'])}]  {t['path']}")
        print(f"    memory: {t['memory']['message']}")
        if t["drafters"]:
            print(f"    DFlash drafters that fit: {', '.join(t['drafters'])}")
        else:
            print("    no DFlash drafter fits: plain decoding only")
        for nf in t["not_fitting"]:
            print(f"    does not fit: {nf['name']}: {nf['reason']}")
        for p in t.get("drafter_probes", []):
            extra = (f" (tau {p['tau']:.1f}, {p['cycles']} cycles, {p['seconds']:.2f} s)"
                     if p["cycles"] else "")
            print(f"    probe with {p['drafter_name']}: {p['label']}{extra}")
    print("Drafters:")
    if not report["drafters"]:
        print("  (none)")
    for d in report["drafters"]:
        print(f"  {d['name']}  [{d['source']}, {format_bytes(d['size_bytes'])}]  {d['path']}")
    print("Known pairs (approximate download):")
    for p in report["known_pairs"]:
        have = "cached" if p["target_cached"] and p["drafter_cached"] else "not cached"
        think = "thinking on" if p["thinking"] else "thinking off"
        print(
            f"  {p['target_repo']} + {p['drafter_repo']}  ~{p['download_gb']:.1f} GB, "
            f"block {p['block_size']}, {think}  ({have})"
        )
    for s in report["skipped"]:
        hint = ""
        if s["reason"] == FOLDER_GONE:
            hint = f" (python -m app models --remove-folder {shlex.quote(s['path'])} forgets it)"
        print(f"skipped {s['path']}: {s['reason']}{hint}")


def _save_error(catalog: Catalog, exc: OSError) -> int:
    """Say in one line that the folder list could not be saved; exit code 2."""
    print(f"error: cannot save the folder list in {catalog.data_dir}: {exc.strerror or exc}",
          file=sys.stderr)
    return 2


def _run_models(args: argparse.Namespace) -> int:
    catalog = Catalog()
    if args.add_folder:
        try:
            found = catalog.add_folder(args.add_folder)
        except (ModelNotFoundError, ModelLoadError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            return _save_error(catalog, exc)
        print(f"added {args.add_folder}: {', '.join(e.name for e in found)}", file=sys.stderr)
    if args.remove_folder:
        try:
            removed = catalog.remove_folder(args.remove_folder)
        except OSError as exc:
            return _save_error(catalog, exc)
        if not removed:
            print(f"error: {args.remove_folder} is not in the folder list", file=sys.stderr)
            return 2
        print(f"removed {args.remove_folder} from the folder list (its files stay)",
              file=sys.stderr)
    if args.download:
        code = _download_cli(args.download)
        if code:
            return code
        catalog.refresh()
    report = catalog_report(catalog)
    from app.engine.costs import stored_models
    from app.paths import default_data_dir

    # the measured costs of --block-size auto (app.engine.costs), per pair and device
    report["cost_models"] = stored_models(default_data_dir())
    if args.probe is not None:
        known = {v for item in report["targets"]
                 for v in (item["name"], item.get("repo_id"), item["path"]) if v}
        unknown = [n for n in args.probe if n not in known]
        if unknown:
            print(f"error: --probe: no target named {', '.join(map(repr, unknown))} (give a "
                  "name, repo id or path as `python -m app models` lists them)", file=sys.stderr)
            return 2
        _probe_pairs(catalog, report, args.probe)
    if catalog.folders_error:
        print(f"warning: {catalog.folders_error}", file=sys.stderr)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_text(report)
    return 0


def _probe_pairs(catalog: Catalog, report: dict, names: list[str]) -> None:
    """``--probe``: load each listed target (those named in ``names``, by name, repo id or
    path; every one when empty) with each DFlash or DFlash2 drafter that fits it, one pair at
    a time, and run the drafter fit probe (:func:`app.chat.drafter_probe.probe_drafter`);
    each result goes into the target's ``drafter_probes`` as
    :meth:`~app.chat.drafter_probe.DrafterProbe.to_dict`. A pair that fails to load gets an
    ``unknown`` verdict with the message in ``error``. Progress lines go to stderr."""
    from app.chat.drafter_probe import DrafterProbe, pair_key, probe_drafter
    from app.models import loader

    entries = {str(t.path): t for t in catalog.scan().targets}
    for item in report["targets"]:
        entry = entries.get(item["path"])
        if entry is None or (names and not {item["name"], item.get("repo_id"),
                                            item["path"]} & set(names)):
            continue
        drafters = [c.drafter for c in catalog.pair_checks(entry) if c.fits]
        if not drafters:
            continue
        print(f"probing {item['name']} with {len(drafters)} drafter"
              f"{'' if len(drafters) == 1 else 's'}…", file=sys.stderr)
        try:
            target = loader.load_target(entry.path)
        except EngineError as exc:
            item["drafter_probes"] = [DrafterProbe(*pair_key(entry.path, d.path), d.name,
                                                   "unknown", error=str(exc)).to_dict()
                                      for d in drafters]
            continue
        probes = []
        for d in drafters:
            try:
                drafter = loader.load_drafter(d.path)
                loader.check_pair(target, drafter)
                probes.append(probe_drafter(target, drafter).to_dict())
            except EngineError as exc:
                probes.append(DrafterProbe(*pair_key(entry.path, d.path), d.name, "unknown",
                                           error=str(exc)).to_dict())
            drafter = None
        item["drafter_probes"] = probes
        target = None
        _release_memory()


def _release_memory() -> None:
    """Drop MLX's buffer cache after a probed pair (the next one loads on a clean slate)."""
    import gc

    import mlx.core as mx

    gc.collect()
    mx.clear_cache()


def _download_cli(repos: list[str]) -> int:
    """Download ``repos`` in order, printing one progress line to stderr; 2 on failure."""
    from app.models import download as dl

    def show(p) -> None:
        total = format_bytes(p.bytes_total) if p.bytes_total else "?"
        eta = f"{p.eta_s:.0f} s" if p.eta_s is not None else "?"
        print(
            f"\r{p.repo_id}: {format_bytes(p.bytes_done)} of {total}, "
            f"{format_bytes(p.rate_bps)}/s, {eta} left   ",
            end="",
            file=sys.stderr,
            flush=True,
        )

    for repo in repos:
        try:
            path = dl.download_repo(repo, on_progress=show, min_interval_s=0.5)
        except KeyboardInterrupt:
            print(f"\ndownload of {repo} interrupted; run again to resume", file=sys.stderr)
            return 2
        except EngineError as exc:
            print(f"\nerror: {exc}", file=sys.stderr)
            return 2
        print(f"\n{repo}: {path}", file=sys.stderr)
    return 0


def register(subparsers) -> None:
    """Add ``models [--json] [--probe [TARGET...]] [--add-folder DIR] [--remove-folder DIR]
    [--download REPO...]``."""
    p = subparsers.add_parser(
        "models",
        help="list targets and DFlash drafters (bundled, folders, HF cache) and which fit",
        description="List every target and DFlash drafter with its source (bundled, folder, "
        "cache), path and size on disk, and for each target the drafters that fit it.",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--probe",
        nargs="*",
        metavar="TARGET",
        help="load each target (or only those named, by name, repo id or path) with each "
        "drafter that fits it and run a short greedy DFlash probe (3 cycles on a fixed "
        "prompt): does the drafter fit? Loads the models, so it takes as long as loading "
        "them; the listing alone reads only config files. The results go in each target's "
        "drafter_probes (JSON) or a 'probe with' line",
    )
    p.add_argument("--add-folder", metavar="DIR", help="add a model folder (persisted)")
    p.add_argument("--remove-folder", metavar="DIR", help="forget a model folder")
    p.add_argument(
        "--download",
        nargs="+",
        metavar="REPO",
        help="download Hugging Face repos into the cache first (e.g. a known pair's target "
        "and drafter)",
    )
    p.set_defaults(func=_run_models)
