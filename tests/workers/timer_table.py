"""What the test Workers read of the scheduler's timer table, which an object makes only for a durable participant."""


def durable_timer_rows(sql) -> int:
    """Rows in ``durability_timers`` (``sql``: ``ctx.storage.sql``); none while the table is not made."""
    made = sql.exec("SELECT 1 AS made FROM sqlite_master WHERE type = 'table' AND name = 'durability_timers'")
    if not made.toArray():
        return 0
    return sql.exec("SELECT count(*) AS n FROM durability_timers").one()["n"]
