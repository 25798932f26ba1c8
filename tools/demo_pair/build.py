"""Rebuild the bundled demo pair from scratch (deterministic given ``--seed``).

Steps (all of them by default; ``--stage`` runs one):

1. ``prepare`` (CPU, main venv): generate the seeded corpus, train the byte-level BPE tokenizer,
   tokenize, write ``BUILD/dataset.npz``, ``BUILD/specs.json``, ``BUILD/tokenizer/`` and
   ``tools/demo_pair/heldout_prompts.json`` (``BUILD`` defaults to ``build/demo_pair/``).
2. ``train`` (torch; GPU recommended): ``tools/demo_pair/train.py`` writes
   ``BUILD/out/demo-target`` and ``BUILD/out/demo-dflash``. Needs torch + transformers; run it
   with the venv that has them (``.venv-train``) or on a GPU machine over a copy of ``BUILD``.
3. ``install``: copy the checkpoints, tokenizer files, training log and held-out prompts
   into ``resources/models/demo-target`` and ``resources/models/demo-dflash``.
4. ``dflash2`` (only when asked: ``--stage dflash2 --dflash2 EXPORT``): write the DFlash2
   drafter export ``EXPORT`` (``train_dflash2.py --freeze-backbone``'s
   ``demo-dflash2`` folder) into ``resources/models/demo-dflash2`` as an adapter on
   ``demo-dflash`` (``app.models.adapter``: only the tensors that differ, plus
   ``"dflash_backbone": "../demo-dflash"`` in its config).

Usage::

    python -m tools.demo_pair.build --seed 0 [--device cuda|cpu] [--stage prepare|train|install]
    python -m tools.demo_pair.build --stage dflash2 --dflash2 build/d2/l2r32frozen/demo-dflash2
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
DEFAULT_BUILD = REPO / "build" / "demo_pair"  # build/ is git-ignored
RES = REPO / "resources" / "models"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja")


DEFAULT_CHATS = 30_000
"""Training chats of the shipped build."""
HELDOUT_FILES = ("heldout_prompts.json", "heldout_scripts.json")


def forbidden_texts(seed: int) -> set[str]:
    """The user texts the corpus never uses: every one of held-out set v1 (beside the
    target, written from ``seed`` when missing: :func:`heldout_sets`) and of the frozen v2
    (``heldout_v2.user_texts``)."""
    from tools.demo_pair import corpus, heldout_v2

    prompts, scripts = heldout_sets(seed)
    return corpus.heldout_user_texts(prompts, scripts) | heldout_v2.user_texts()


def heldout_sets(seed: int) -> tuple[list[dict], list[dict]]:
    """The held-out prompts and scripts: the committed files in this folder when they exist
    (they are frozen before the first training run), else generated from ``seed`` and
    written there."""
    from tools.demo_pair import corpus

    paths = [HERE / n for n in HELDOUT_FILES]
    if all(p.exists() for p in paths):
        return tuple(json.loads(p.read_text()) for p in paths)  # type: ignore[return-value]
    prompts, scripts = corpus.heldout_prompts(seed), corpus.heldout_scripts(seed)
    for p, obj in zip(paths, (prompts, scripts)):
        p.write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n")
    return prompts, scripts


def prepare(build: Path, seed: int, n_chats: int, tokenizer: Path | None = None,
            corpus_version: str = "v6") -> dict:
    """Held-out sets -> corpus -> tokenizer -> ``dataset.npz`` + ``specs.json``.

    ``tokenizer``: a folder holding an existing tokenizer (e.g. the shipped target's) to reuse
    instead of training a new one, so that a pair can be trained on from its checkpoints.
    ``corpus_version``: ``data.CORPUS_VERSIONS`` (``v5e`` reproduces the v9 pair's stage-14
    data). Prints and returns the report: examples, tokens, completion tokens, the
    distribution of example lengths (prompt + completion, tokens) and the share of each kind
    of user turn (``report.json`` beside the data)."""
    import numpy as np
    from tokenizers import Tokenizer

    from tools.demo_pair import data

    build.mkdir(parents=True, exist_ok=True)
    forbidden = forbidden_texts(seed)
    stats: dict = {}
    pairs = data.generate_texts(seed, n_chats, forbidden, version=corpus_version, stats=stats)
    print(f"{len(pairs)} examples from {n_chats} chats (corpus {corpus_version})", flush=True)
    # The tokenizer is trained on a sample (the texts repeat the same system prompt).
    rng = np.random.default_rng(seed)
    sample = rng.choice(len(pairs), size=min(len(pairs), 20_000), replace=False)
    if tokenizer is None:
        data.train_tokenizer([pairs[i][0] + pairs[i][1] for i in sample], build / "tokenizer")
    else:
        (build / "tokenizer").mkdir(parents=True, exist_ok=True)
        for name in TOKENIZER_FILES:
            if (tokenizer / name).exists():
                shutil.copyfile(tokenizer / name, build / "tokenizer" / name)
    arrays = data.tokenize_pairs(build / "tokenizer", pairs)
    arrays["tokens"] = arrays["tokens"].astype(np.uint16)
    np.savez_compressed(build / "dataset.npz", **arrays)
    tok = Tokenizer.from_file(str(build / "tokenizer" / "tokenizer.json"))
    vocab = tok.get_vocab_size(with_added_tokens=True)
    eos = tok.token_to_id("<|im_end|>")
    mask = tok.token_to_id("<|mask|>")
    pad = tok.token_to_id("<|endoftext|>")
    specs = {
        "seed": seed,
        "corpus": corpus_version,
        "target": {"vocab_size": vocab, "eos_token_id": eos, "pad_token_id": pad},
        "drafter": {"vocab_size": vocab, "mask_token_id": mask},
    }
    (build / "specs.json").write_text(json.dumps(specs, indent=2) + "\n")
    lens = np.diff(arrays["offsets"])
    comp = lens - arrays["prompt_lens"]
    print(f"vocab {vocab}; tokens {int(lens.sum())}; completion tokens {int(comp.sum())}; "
          f"mean length {lens.mean():.0f}; {len(forbidden)} held-out user texts left out",
          flush=True)
    edges = [0, 512, 1024, 2048, 3072, 3584, 4096, 1 << 30]
    hist = np.histogram(lens, bins=edges)[0]
    report = {
        "corpus": corpus_version, "chats": n_chats, "seed": seed, "examples": len(pairs),
        "tokens": int(lens.sum()), "completion_tokens": int(comp.sum()),
        "max_length": int(lens.max()),
        "length_percentiles": {str(q): int(np.percentile(lens, q)) for q in (50, 90, 99)},
        "lengths": {f"{a}-{b if b < 1 << 30 else 'inf'}": int(n)
                    for a, b, n in zip(edges[:-1], edges[1:], hist)},
        "tokens_in_examples_over_2048": int(lens[lens > 2048].sum()),
        **stats,
    }
    (build / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1), flush=True)
    return report


SHAPE = "h384-l6-a3"
"""The shipped target shape (``modeling.SHAPES``)."""
RECIPE: list[list[str]] = [
    # 1: target from scratch (290 s), continuations, drafter (120 s)
    ["--time-target", "290", "--target-lr", "2e-3", "--time-gen", "60", "--time-drafter", "120"],
    # 2: the target trained on (300 s), new continuations, drafter trained on (110 s)
    ["--init", "--time-target", "300", "--target-lr", "1.5e-3", "--time-gen", "60",
     "--time-drafter", "110"],
    # 3: target kept, new continuations, drafter trained on (235 s)
    ["--init", "--target-steps", "0", "--time-target", "0", "--time-gen", "60",
     "--time-drafter", "235", "--drafter-lr", "8e-4"],
    # 4: corpus v3 (the shipped pair ran it over a second prepared set, 40,000 chats, seed 1)
    ["--init", "--time-target", "320", "--target-lr", "1e-3", "--time-gen", "60",
     "--time-drafter", "105"],
    # 5: corpus v4 (60,000 chats, seed 2, the shipped tokenizer), twice the batch
    ["--init", "--time-target", "380", "--target-lr", "1e-3", "--target-batch-tokens", "128000",
     "--time-gen", "45", "--time-drafter", "90"],
    # 6: corpus v4b (60,000 chats, seed 3): the target only, drafter kept
    ["--init", "--time-target", "470", "--target-lr", "8e-4", "--target-batch-tokens", "128000",
     "--drafter-steps", "0", "--gen-prompts", "512", "--time-gen", "15", "--time-drafter", "0"],
    # 7: corpus v4c (60,000 chats, seed 4): the target only, drafter kept
    ["--init", "--time-target", "500", "--target-lr", "6e-4", "--target-batch-tokens", "128000",
     "--drafter-steps", "0", "--gen-prompts", "512", "--time-gen", "15", "--time-drafter", "0"],
    # 8: corpus v4c: target kept, new continuations, the drafter trained on (420 s)
    ["--init", "--target-steps", "0", "--time-target", "0", "--time-gen", "60",
     "--time-drafter", "420", "--drafter-lr", "8e-4"],
    # 9: corpus v4d (60,000 chats, seed 5): the target only, drafter kept
    ["--init", "--time-target", "500", "--target-lr", "6e-4", "--target-batch-tokens", "128000",
     "--drafter-steps", "0", "--gen-prompts", "512", "--time-gen", "15", "--time-drafter", "0"],
    # 10: corpus v4e (60,000 chats, seed 6): target (300 s), new continuations, drafter (185 s)
    ["--init", "--time-target", "300", "--target-lr", "5e-4", "--target-batch-tokens", "128000",
     "--time-gen", "45", "--time-drafter", "185", "--drafter-lr", "8e-4"],
    # 11: corpus v5 (60,000 chats, seed 7: piece names): the target only, drafter kept
    ["--init", "--time-target", "500", "--target-lr", "6e-4", "--target-batch-tokens", "128000",
     "--drafter-steps", "0", "--gen-prompts", "512", "--time-gen", "15", "--time-drafter", "0"],
    # 12: corpus v5b (60,000 chats, seed 8): target (300 s), new continuations, drafter (185 s)
    ["--init", "--time-target", "300", "--target-lr", "5e-4", "--target-batch-tokens", "128000",
     "--time-gen", "45", "--time-drafter", "185", "--drafter-lr", "8e-4"],
    # 13: corpus v5d (60,000 chats, seed 10): target (300 s), new continuations, drafter (185 s)
    ["--init", "--time-target", "300", "--target-lr", "5e-4", "--target-batch-tokens", "128000",
     "--time-gen", "45", "--time-drafter", "185", "--drafter-lr", "8e-4"],
    # 14: corpus v5e (60,000 chats, seed 12): target (300 s), new continuations, drafter (185 s)
    ["--init", "--time-target", "300", "--target-lr", "5e-4", "--target-batch-tokens", "128000",
     "--time-gen", "45", "--time-drafter", "185", "--drafter-lr", "8e-4"],
]
"""The shipped build's training stages (each one device command of under 10 minutes): each
stage after the first starts from the previous stage's exported pair (``--init``)."""


def train(build: Path, device: str, python: str, extra: list[str]) -> None:
    """Run the :data:`RECIPE` stages of ``train.py`` (subprocesses, so that the main venv
    needs no torch); stage ``k`` writes ``BUILD/stage{k}``, the last one is copied to
    ``BUILD/out``."""
    prev = None
    for k, stage in enumerate(RECIPE, 1):
        out = build / f"stage{k}"
        args = [a for a in stage if a != "--init"]
        if "--init" in stage:
            args += ["--init-target", str(prev / "demo-target"),
                     "--init-drafter", str(prev / "demo-dflash")]
        cmd = [python, str(HERE / "train.py"), "--data", str(build), "--out", str(out),
               "--device", device, "--shape", SHAPE, "--target-steps", "100000",
               "--drafter-steps", "100000", *args, *extra]
        print(" ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, cwd=REPO)
        prev = out
    if (build / "out").exists():
        shutil.rmtree(build / "out")
    shutil.copytree(prev, build / "out")


def install(build: Path, trained: Path) -> None:
    """Copy checkpoints + tokenizer + held-out prompts into ``resources/models``."""
    tdir, ddir = RES / "demo-target", RES / "demo-dflash"
    tdir.mkdir(parents=True, exist_ok=True)
    ddir.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(trained / "demo-target" / name, tdir / name)
        shutil.copyfile(trained / "demo-dflash" / name, ddir / name)
    for name in TOKENIZER_FILES:
        src = build / "tokenizer" / name
        if src.exists():
            shutil.copyfile(src, tdir / name)
    for name in HELDOUT_FILES:
        shutil.copyfile(HERE / name, tdir / name)
    log = trained / "train_log.json"
    if log.exists():
        shutil.copyfile(log, tdir / "train_log.json")
    print(f"installed into {tdir} and {ddir}", flush=True)


def install_dflash2(export: Path) -> dict:
    """Write the DFlash2 export ``export`` into ``resources/models/demo-dflash2`` as an adapter
    on ``demo-dflash`` (every backbone tensor must be byte-equal to ``demo-dflash``'s: a
    drafter trained with ``--freeze-backbone``; else the adapter would keep them too and
    the pair would break its size cap, which this refuses)."""
    from app.models.adapter import write_adapter

    out = RES / "demo-dflash2"
    info = write_adapter(export, RES / "demo-dflash", out, ref="../demo-dflash")
    backbone_like = [k for k in info["kept"] if "_conv." not in k
                     and not k.startswith("candidate_selector.")]
    if backbone_like:
        raise SystemExit(f"{export}: {len(backbone_like)} backbone tensors differ from "
                         f"demo-dflash's (e.g. {backbone_like[0]}); train with "
                         "--freeze-backbone --init-dflash resources/models/demo-dflash")
    print(f"installed {len(info['kept'])} tensors ({info['bytes']:,} bytes; "
          f"{info['shared']} shared with demo-dflash) into {out}", flush=True)
    return info


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description="rebuild the bundled demo model pair")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", help="torch device for training (cuda|cpu)")
    p.add_argument("--stage", choices=["prepare", "train", "install", "all", "dflash2"], default="all")
    p.add_argument("--build", type=Path, default=DEFAULT_BUILD)
    p.add_argument("--chats", type=int, default=DEFAULT_CHATS)
    p.add_argument("--corpus", default="v6", choices=["v5e", "v6"],
                   help="corpus generator (v5e: the v9 pair's stage-14 data)")
    p.add_argument("--tokenizer", type=Path, default=None,
                   help="reuse this folder's tokenizer (to train on from a shipped pair)")
    p.add_argument("--train-python", default=str(REPO / ".venv-train" / "bin" / "python"),
                   help="a Python with torch + transformers")
    p.add_argument("--trained", type=Path, default=None,
                   help="folder with demo-target/ and demo-dflash/ (default BUILD/out)")
    p.add_argument("--dflash2", type=Path, default=None,
                   help="stage dflash2: the DFlash2 export folder to install as an adapter")
    args, extra = p.parse_known_args(argv)
    if args.stage == "dflash2":
        if args.dflash2 is None:
            p.error("--stage dflash2 needs --dflash2 EXPORT_FOLDER")
        install_dflash2(args.dflash2)
        return 0
    if args.stage in ("prepare", "all"):
        prepare(args.build, args.seed, args.chats, args.tokenizer, args.corpus)
    if args.stage in ("train", "all"):
        py = args.train_python if Path(args.train_python).exists() else sys.executable
        train(args.build, args.device, py, ["--seed", str(args.seed), *extra])
    if args.stage in ("install", "all"):
        install(args.build, args.trained or args.build / "out")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
