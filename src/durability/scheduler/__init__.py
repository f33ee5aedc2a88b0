"""The scheduler: named durable timers sharing a Durable Object's one alarm.

Lives here: ``DurabilityScheduler`` (``alarm``), running due timers within
one alarm (``dispatch``), a new instance's check of its alarm and resuming
one the runtime gave up on (``resume``), and where timers are kept, rows or
memory (``timer_stores``). Must not know: what any timer does.
"""

from .alarm import DurabilityScheduler as DurabilityScheduler
from .dispatch import Timer as Timer, TimerHandler as TimerHandler
