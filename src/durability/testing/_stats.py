"""What one object would be billed for, as production bills it.

Lives here: ``ObjectStats``, the counts the host and its meters keep
(requests, alarms, the alarm writes, instances, CPU and awake time), and
the memory that duration is billed at.
Must not know: how anything is counted; the host and ``_meters`` count,
and write what they count here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Duration is billed per GB-s at 128 MB an object, whatever it uses.
OBJECT_GB = 0.128


@dataclass
class ObjectStats:
    """What this object would be billed for, counted as production bills it."""

    requests: int = 0
    alarm_invocations: int = 0
    alarm_writes: int = 0
    evictions: int = 0
    hibernations: int = 0  #: instances dropped for having nothing pending (``hibernate_after_ms``)
    instances_created: int = 0
    overloaded: int = 0  #: calls refused as overloaded (not billed, never run)
    peak_requests_per_s: int = 0  #: the most requests taken within any one second
    #: requests taken per second of the runtime's clock (second since it started -> count)
    requests_by_second: dict[int, int] = field(default_factory=dict)
    cpu_s: float = 0.0  #: CPU seconds the object's code ran for (every step of its tasks)
    #: seconds of the clock the object was awake, as duration is billed: while
    #: an event runs, a task of its instance is pending (awaiting a call, a
    #: fetch, a sleep) or a timer its code set is pending; periods still open
    #: are added by ``ObjectHost.awake_s()``
    awake_s: float = 0.0
    #: those periods, as (start, end) in seconds of the loop's clock
    awake_periods: list[tuple[float, float]] = field(default_factory=list)

    @property
    def cpu_ms_per_request(self) -> float:
        return 1000 * self.cpu_s / self.requests if self.requests else 0.0

