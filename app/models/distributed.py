"""Loading a target sharded over a group of processes (:mod:`app.engine.distributed`).

Every rank runs the same command (``mlx.launch`` starts it on each host, or
:mod:`app.commands.distributed` on this one); :func:`load_shard` gives rank 0 a
:class:`~app.models.loader.LoadedTarget` whose ``shard`` runs the other ranks' layers, and
every other rank a :class:`~app.engine.distributed.ShardWorker` to serve. Each rank reads the
weights of its own layers only (rank 0 also the embedding, the final norm and the LM head).
"""

from __future__ import annotations

from pathlib import Path

from app.engine.distributed import DistributedRunner, Link, ShardWorker, even_split, layer_ranges
from app.engine.errors import ModelLoadError
from app.models.loader import (
    LoadedTarget,
    load_target,
    read_config,
    resolve_model_path,
    text_config,
)


def parse_layer_split(text: str | None, num_layers: int, size: int) -> list[int]:
    """Layer counts per rank from ``--layer-split`` (``"12,12"``: rank 0 the first 12 layers,
    rank 1 the next 12), or an even split when ``text`` is None or empty.

    Raises:
        ModelLoadError: not ``size`` whole numbers >= 1 adding up to ``num_layers``.
    """
    if not text:
        return even_split(num_layers, size)
    try:
        split = [int(part) for part in text.split(",")]
    except ValueError:
        raise ModelLoadError(f"--layer-split {text!r}: expected whole numbers separated by "
                             "commas, e.g. 12,12") from None
    if len(split) != size or any(n < 1 for n in split) or sum(split) != num_layers:
        raise ModelLoadError(
            f"--layer-split {text!r}: give {size} layer counts of at least 1 (one per process) "
            f"that add up to the target's {num_layers} layers")
    return split


def num_layers_of(path_or_repo: str | Path) -> int:
    """Decoder layers of the target in a folder or cached repo (``num_hidden_layers``)."""
    cfg = text_config(read_config(resolve_model_path(path_or_repo)))
    return int(cfg["num_hidden_layers"])


def load_shard(path_or_repo: str | Path, link: Link, split: str | None = None,
               keep_quantized: bool | None = None) -> LoadedTarget | ShardWorker:
    """Load this rank's part of the target.

    Args:
        path_or_repo: the target folder or cached repo id (the same on every rank).
        link: this rank's :class:`~app.engine.distributed.Link`.
        split: ``--layer-split`` text (None: even).
        keep_quantized: as :func:`~app.models.loader.load_target`.

    Returns:
        Rank 0: the target, with ``shard`` set (the model holds rank 0's layers); another
        rank: its :class:`~app.engine.distributed.ShardWorker` (call ``serve()``).

    Raises:
        ModelLoadError, ModelNotFoundError, UnsupportedArchitectureError: as
        :func:`~app.models.loader.load_target`, or a bad split.
    """
    ranges = layer_ranges(parse_layer_split(split, num_layers_of(path_or_repo), link.size))
    rank = link.rank
    target = load_target(path_or_repo, keep_quantized=keep_quantized, layers=ranges[rank],
                         ends=rank == 0)
    link.barrier()  # every rank loaded: from here on the network timeout applies
    if rank != 0:
        return ShardWorker(target.model, target.model_type, link, ranges)
    target.shard = DistributedRunner(target.model, target.model_type, link, ranges)
    return target
