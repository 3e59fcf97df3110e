"""The lease rules of the two work queues, fan-out tasks and import pages, written once.

A queue's row is worked on by one claim at a time, for a lease; the rules:

- Claimable: a row is claimable when it waits, Pending and available (no `available_at`, or one at or
  before `now`), or when its lease is over: InProgress with its lease run out (`lease_until <= now`), or with
  an owner whose holder is gone (the claiming process's holder session has ended: `claim_holder_gone`,
  migration 0009), which is taken over at once rather than when the lease runs out.
- A claim writes the claim's id as the owner (the fencing token), the process's holder key, `lease_until`
  (`now` plus the lease's length) and one more attempt, and makes the row InProgress.
- The fence ("still mine"): a write under the lease goes through only while the row is InProgress and its
  owner is still the claim's id. A lease that ran out but that no other claim took over is still the owner's:
  the takeover is what rewrites the owner, and the fence's statement locks the row for the rest of the
  transaction, so a claim waiting on it skips the row (SKIP LOCKED) and the two never both write.
- Renew: the fence writes `lease_until` anew (`now` plus the lease's length) at each transaction it opens.
- Complete: the owner ends its row's lease (no `lease_until` any more); the row leaves the queue.
- Release: the owner gives the lease back before it runs out. A failed attempt counts, and the row is
  available again after a back-off (`available_at = now + backoff(attempt)`); a release that does not count
  (a graceful stop) gives the attempt back and makes the row available at once.
- Fail exhausted: a row whose attempts are spent (`attempt_count >= max_attempts`) and that nobody holds (it
  waits, or its lease is over) is Failed rather than claimed again; each queue's job runs it before a claim,
  at the same `now`. An import page whose counted release spent its last attempt is Failed by the release
  itself.

Where they live, and why. The values a queue writes are computed here, from a `now` passed in and the queue's
settings (`FanOutSettings.lease_rules`, `ImportSettings.lease_rules`), with no clock of their own, and each
queue's SQL takes them as parameters: no lease statement reads the server's clock, so the rules are tested at
any time one likes. The conditions on a row as stored (claimable: `lease_available` or `lease_over`; the
fence: `lease_still_mine`; `lease_spent`) are SQL, named once each in `adapters/postgres/leases.sql`, which
both queues' statements include with their own column names; the fence itself is run by the one adapter
helper both stores use (`database.Fence`). Not one adapter for both queues: the two tables keep their own
column names and where a released row waits (a fan-out task stays InProgress without an owner until its
`lease_expires_at`, an import page goes back to Pending with an `available_at`), which only a migration could
change; the conditions above hold for both as they are stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from pin_identity.domain.backoff import Backoff


@dataclass(frozen=True)
class Release:
    """A claim handing its lease back before it runs out: available again at `available_at`; a counted
    (failed) attempt keeps its error, an uncounted one (a graceful stop) gives the attempt back."""

    available_at: datetime
    count_attempt: bool
    error: str | None


@dataclass(frozen=True)
class LeaseRules:
    """One queue's lease: its length, how many attempts a row has (spent at `max_attempts`: a condition on the
    row as stored, which its statements test), the back-off after a failed one."""

    length: timedelta
    max_attempts: int
    backoff: Backoff

    def until(self, now: datetime) -> datetime:
        """The end of a lease claimed or renewed at `now`."""
        return now + self.length

    def release(self, now: datetime, attempt: int, *, count_attempt: bool, error: str | None) -> Release:
        """The release of a lease on its `attempt`-th attempt: a counted one waits its back-off."""
        if not count_attempt:
            return Release(now, count_attempt=False, error=error)
        return Release(now + self.retry_delay(attempt), count_attempt=True, error=error)

    def retry_delay(self, attempt: int) -> timedelta:
        """The wait after failed attempt number `attempt` (1 for the first)."""
        return timedelta(seconds=self.backoff.delay(attempt))
