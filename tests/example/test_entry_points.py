"""The library's public surface: the specification's experimental entry point, and each primitive's ``migrate``."""

import types

import pytest

import durability.experimental.semaphore as experimental
import durability.semaphore as stable
from durability import DurabilityOutbox
from durability._common.schema import migrate
from durability._common.sql import Sql
from durability.locks.holder import PlaceKeeper
from durability.locks.store import PlaceStore
from durability.outbox import _SCHEMA as outbox_schema
from durability.semaphore import DurabilitySemaphore, DurabilitySemaphoreQueue
from durability.semaphore.holder.store import HolderStore
from durability.semaphore.queue.store import QueueStore
from support import SchemaStorage


def test_the_experimental_entry_point_exports_the_semaphore_s_names_as_they_are():
    assert experimental.__all__ == stable.__all__
    assert all(getattr(experimental, name) is getattr(stable, name) for name in stable.__all__)
    assert experimental.DurabilitySemaphore.__name__ == "DurabilitySemaphore"


@pytest.mark.parametrize("primitive, create", [
    (DurabilitySemaphore, lambda sql: HolderStore(sql)),
    (DurabilitySemaphoreQueue, lambda sql: QueueStore(sql)),
    (DurabilityOutbox, lambda sql: migrate(sql, "outbox", outbox_schema)),
    (PlaceKeeper, lambda sql: PlaceStore(sql)),
])
def test_every_primitive_s_migrate_removes_its_tables_and_refuses_other_versions(primitive, create):
    ctx = types.SimpleNamespace(storage=SchemaStorage())
    create(Sql(ctx))
    before = ctx.storage.tables()
    with pytest.raises(ValueError, match="only migrate"):
        primitive.migrate(ctx, 2)
    assert ctx.storage.tables() == before
    primitive.migrate(ctx, None)
    assert ctx.storage.tables() == {"durability_schema"} and len(before) > 1
    assert ctx.storage.exec("SELECT * FROM durability_schema").toArray() == []
