"""A holder's place in a budget tree: its link to its parent, and its waker of quiet children.

Lives here: ``child_link``, which gives a holder whose object's name is a
child's its link to its parent (none for the root, or for a holder
outside any tree), and ``object_name``. The child's side lives in
``tree/parent_link`` (``ParentLink``: asking its parent for permits, and
giving them back, on the scheduler's timers) and ``tree/link_ceilings``
(what a round may hand out of what the child borrowed); the parent's
side, waking its children that have gone quiet, in ``tree/children``
(``Waker``). The rules themselves (what is held, what is given back) are
pure, in ``tree``. Must not know: how a holder allocates, or SQL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..client import SemaphoreClient
from ..holder.store import HolderStore
from .children import Waker as Waker
from .parent_link import (
    AFTER_BEAT_MS as AFTER_BEAT_MS,
    ASK as ASK,
    GIVE as GIVE,
    GIVER as GIVER,
    ParentLink as ParentLink,
    _may_have_lent as _may_have_lent,
)
from .pure.rules import parent_of


def object_name(ctx: Any) -> str:
    """The holder object's name (``ctx.id.name``; "" for an object without one)."""
    name = getattr(getattr(ctx, "id", None), "name", None)
    return name if isinstance(name, str) else ""


def child_link(parent: SemaphoreClient | None, scheduler: Any, period_ms: float, on_lent: Callable[[], bool],
               charged: Callable[[], dict[str, int]], store: HolderStore) -> ParentLink | None:
    """The link of a holder whose object's name is a child's to its parent;
    None for the root, or for a holder outside any tree."""
    name = object_name(scheduler.ctx)
    parent_key = parent_of(name)
    if parent is None or parent_key is None:
        return None
    return ParentLink(parent, parent_key, name, period_ms, on_lent, charged, store, scheduler)
