"""The fast lane (docs/contract.md §10): entries that matter to their user now flush that user at once.

The compaction window (app/domain/flush.py) is what makes a 1,000-member group affordable (J-1),
but a user does not wait a window for a direct message or a mention. An applied entry that
matters now — a `message` that mentions the user (@all included), a message in a conversation
of at most `max_members` members (its `member_count`; 2 = a direct message), a `message` its
producer marked `urgent`, a `read`, a `mark_unread` — flushes its user's dirty rows right after
it is applied, instead of at the window's end. Everything else keeps the window. (The rule is
app/domain/processor.py's, inline on its hot path; this module holds the rate.)

Bounded per user: at most `per_user_per_s` fast flushes in any 1,000 ms of the clock; beyond
that the user's rows wait for the window, so a spammy conversation cannot undo the compaction.
A row's writes then stay <= ceil(span / window) + 1 + the fast flushes that wrote it.

The clock is the processor's (entry `ts` in replay, the wall clock of the batch in the worker)
at the entries that asked for the fast lane, taken as its highest value so far: time that
steps back (entries of other lanes, a clock adjusted) never reopens a second already spent, and
what is older than a second of it can be forgotten. The limiter's memory is not checkpointed
(like the dirty set): after a restart a user may take up to `per_user_per_s` more fast flushes
in that second, which the bound counts.
"""

from __future__ import annotations

# The two settings' defaults and bounds, declared once (the projector's config, the settings and
# the replay command use them): direct messages are small conversations; a user takes at most 5
# fast flushes a second.
FAST_LANE_MAX_MEMBERS = 2
FAST_LANE_PER_USER_PER_S = 5
FAST_LANE_MAX_MEMBERS_MIN = 0  # 0: no conversation is small (mentions, urgent, reads still fast)
FAST_LANE_MAX_MEMBERS_MAX = 2**32 - 1  # member_count is a u32
FAST_LANE_PER_USER_PER_S_MIN = 0  # 0: the fast lane is off (every entry waits for the window)
FAST_LANE_PER_USER_PER_S_MAX = 1000
# The rate's period, in the clock's unit (ms).
SECOND_MS = 1000
# The limiter forgets users idle for a second only when it holds more than this many (and then
# at most twice as many as after the last time): its memory follows the users of the last second.
_PRUNE_FLOOR = 1024


class FastLaneLimiter:
    """At most `per_user_per_s` fast flushes per user in any second of the (monotonic) clock."""

    def __init__(self, per_user_per_s: int) -> None:
        self.per_user_per_s = per_user_per_s
        self.clock = 0  # the highest time seen
        # user -> the times of its last fast flushes (at most per_user_per_s, oldest first)
        self.recent: dict[int, list[int]] = {}
        self._prune_at = _PRUNE_FLOOR

    def admit(self, user_id: int, now: int) -> bool:
        """True (and counted) when the user may flush now; False: the user waits for the window."""
        limit = self.per_user_per_s
        if limit <= 0:
            return False
        clock = self.clock
        if now > clock:
            clock = self.clock = now
        recent = self.recent
        times = recent.get(user_id)
        if times is None:
            if len(recent) >= self._prune_at:
                self._prune()
            recent[user_id] = [clock]
            return True
        if len(times) < limit:
            times.append(clock)
            return True
        if times[0] <= clock - SECOND_MS:  # the oldest of the last `limit` is a second old
            del times[0]
            times.append(clock)
            return True
        return False

    def _prune(self) -> None:
        """Forget the users whose last fast flush is a second old: they can never be refused by
        it again (the clock does not go back)."""
        horizon = self.clock - SECOND_MS
        self.recent = {user: times for user, times in self.recent.items() if times[-1] > horizon}
        self._prune_at = max(_PRUNE_FLOOR, 2 * len(self.recent))

    @property
    def tracked_users(self) -> int:
        return len(self.recent)
