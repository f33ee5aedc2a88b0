"""The name a queue speaks to its holders as: its object's own id, so that two objects never share one.

Lives here: ``wire_identity`` (the ``clientId`` a queue sends, from its
object's id and the label it may be given) and ``client_label`` (the label
read back, for a holder's ``can_grant``). Must not know: storage, the
holder's rules, or the queue.

A holder keys everything a client holds by the client's id: two objects
that spoke under one id would claim on each other's grants and report
each other's releases, and run more at once than the limit. An object's
id is unique, so a queue speaks as that id, and a label its user gives
it (a shard's name, say) is kept in front of the id, never instead of
it: a constant pasted into two objects still names two clients. Derived
again by every instance, the identity costs no row and no read (a queue
that held work under its label before this rule keeps speaking as the
label until it holds nothing: ``QueueStore.spoken_as_given``).
"""

from __future__ import annotations

from .messages import MAX_ID_LENGTH
from .queue.input import identifier

SEPARATOR = "@"


def wire_identity(object_id: str, label: str | None = None) -> str:
    """``object_id`` alone, or ``<label>@<object_id>`` for a label that is not the id itself."""
    object_id = identifier(object_id, "the object's id")
    if label is None or label == object_id:
        return object_id
    label = identifier(label, "client_id")
    most = MAX_ID_LENGTH - len(object_id) - len(SEPARATOR)
    if len(label) > most:
        raise ValueError(f"client_id must be at most {most} characters: the queue speaks as "
                         f"<client_id>{SEPARATOR}<its object's id>, at most {MAX_ID_LENGTH}")
    return f"{label}{SEPARATOR}{object_id}"


def client_label(client_id: str) -> str:
    """The label a client's queue was given (what comes before its object's
    id), or the whole id when it has none: for a holder's ``can_grant``."""
    label, separator, _ = client_id.rpartition(SEPARATOR)
    return label if separator else client_id
