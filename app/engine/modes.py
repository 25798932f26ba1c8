"""The decoding modes: one table that every layer reads.

A reply is decoded in one :class:`Mode`:

========  =========  ===============  ===========================================
value     label      drafter          what it is
========  =========  ===============  ===========================================
plain     Plain      none             one target step per token
dflash    DFlash     a DFlash one     a block of drafts verified in one pass
dflash2   DFlash2    a DFlash2 one    DFlash with the DFlash2 drafter (its own
                                      candidate walk; ``app.engine.dflash2``)
lookup    Lookup     none             prompt-lookup drafts (the tokens that followed
                                      the latest earlier match of the last 1-3
                                      tokens; ``app.engine.lookup``) verified as
                                      DFlash verifies; a plain step when nothing
                                      matches
========  =========  ===============  ===========================================

:class:`Mode` is a ``StrEnum``: a member equals (and hashes as) its value, so the values
stored in the database, written in JSON and typed on the command line are the members
themselves, and a comparison with a plain string still holds. Code asks the table
(:data:`DRAFTING_MODES`, :data:`DRAFTER_MODES`, :attr:`Mode.label`, :func:`drafter_mode`)
instead of listing modes: "does it draft" (tau, acceptance, block size, rollback apply) is
:attr:`Mode.drafts`, "does it need a drafter loaded" is :attr:`Mode.needs_drafter`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal


@dataclass(frozen=True)
class ModeSpec:
    """One row of the table: ``label`` as the window and the CLI name the mode, ``drafts``
    whether drafts are verified in it (tau, acceptance, block size and rollback apply),
    ``needs_drafter`` whether a drafter model must be loaded for it."""

    label: str
    drafts: bool
    needs_drafter: bool = False


class Mode(StrEnum):
    """A decoding mode (see the module's table)."""

    PLAIN = "plain"
    DFLASH = "dflash"
    DFLASH2 = "dflash2"
    LOOKUP = "lookup"

    @property
    def spec(self) -> ModeSpec:
        """This mode's row of :data:`TABLE`."""
        return TABLE[self]

    @property
    def label(self) -> str:
        """``"Plain"``, ``"DFlash"``, ``"DFlash2"`` or ``"Lookup"``."""
        return self.spec.label

    @property
    def drafts(self) -> bool:
        """Whether drafts are verified in this mode (a drafter's or prompt lookup's)."""
        return self.spec.drafts

    @property
    def needs_drafter(self) -> bool:
        """Whether this mode needs a drafter model loaded (``lookup`` drafts without one)."""
        return self.spec.needs_drafter

    @classmethod
    def parse(cls, value: Any) -> Mode:
        """The member named by ``value`` (a member or its string value).

        Raises:
            ValueError: ``value`` is no mode; the message lists the modes.
        """
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {value!r}") from None


TABLE: dict[Mode, ModeSpec] = {
    Mode.PLAIN: ModeSpec("Plain", drafts=False),
    Mode.DFLASH: ModeSpec("DFlash", drafts=True, needs_drafter=True),
    Mode.DFLASH2: ModeSpec("DFlash2", drafts=True, needs_drafter=True),
    Mode.LOOKUP: ModeSpec("Lookup", drafts=True, needs_drafter=False),
}
"""Every mode's row; a new mode is one member of :class:`Mode` and one row here."""

ModeName = Literal["plain", "dflash", "dflash2", "lookup"]
"""The modes' values as a type (for records checked by their type hints, e.g. an imported
``Summary``); :data:`MODES` holds the same values (``tests/test_modes.py``)."""

MODES: tuple[Mode, ...] = tuple(Mode)
"""Every mode, in the order the window and the CLI list them."""

DRAFTING_MODES: tuple[Mode, ...] = tuple(m for m in Mode if m.drafts)
"""The modes in which drafts are verified (tau, acceptance and block size apply)."""

DRAFTER_MODES: tuple[Mode, ...] = tuple(m for m in Mode if m.needs_drafter)
"""The modes that need a drafter model loaded (a subset of :data:`DRAFTING_MODES`)."""


def needs_drafter(mode: Any) -> bool:
    """Whether ``mode`` (a :class:`Mode` or its value) needs a drafter loaded; False for a
    value that is no mode."""
    return mode in TABLE and TABLE[mode].needs_drafter


DEFAULT_BLOCK_SIZE = 16
"""The block size of a drafter whose ``config.json`` names none (z-lab's DFlash drafters are
trained with blocks of 16), and of lookup mode when none is set. A reply's ``block_size``
None means the loaded drafter's own (``DrafterConfig.block_size``), which falls back to this;
the one place that number is written."""


ROLLBACKS: tuple[str, ...] = ("tape", "replay")
"""How a drafting mode rolls recurrent state back after a partly accepted block, the default
first (``app.engine.rollback``)."""


def label(mode: Any) -> str:
    """The label of ``mode`` (a :class:`Mode` or its value); any other value as given."""
    return TABLE[mode].label if mode in TABLE else str(mode)


def drafter_mode(drafter_or_config: Any) -> Mode:
    """The mode a loaded drafter (or its config) drafts in: ``Mode.DFLASH2`` for a DFlash2
    drafter (config ``kind == "dflash2"``), else ``Mode.DFLASH``. Accepts a
    ``LoadedDrafter`` (its ``.config``), a drafter config, or None (``Mode.DFLASH``)."""
    config = getattr(drafter_or_config, "config", drafter_or_config)
    kind = getattr(config, "kind", None) or getattr(drafter_or_config, "kind", None)
    return Mode.DFLASH2 if kind == Mode.DFLASH2 else Mode.DFLASH
