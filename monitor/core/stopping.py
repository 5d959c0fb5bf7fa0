"""Sequential stopping: how many samples an item needs before its mode is certain.

A rule looks only at the counts of the canonical classes seen so far (never at the
label), so calibration stays valid under adaptive K (paper section 9, 'Conformal
validity with adaptive K') as long as
calibration and monitored items use the same rule and settings.

Rules
-----
``mixture``
    An anytime-valid pairwise test of "the leader is more likely than the runner-up".
    Only draws that fall in {leader a, runner-up b} count: x = n_a, n = n_a + n_b.
    Under H0 "theta = p_a / (p_a + p_b) <= 1/2" the mixture likelihood ratio

        E = w1 * 2^n * [n_b = 0]  +  (1 - w1) * 2^(n+1) * B(x+1, n-x+1) * (1 - I_1/2(x+1, n-x+1))

    (prior: mass ``w1`` at theta' = 1, the rest uniform on [1/2, 1]) is a test
    supermartingale, so by Ville's inequality P(E ever >= m/delta) <= delta/m. The rule
    stops when E >= m/delta with m = observed classes - 1 (at least 1) rivals, or
    m = K_max - 1 in strict mode. E only grows when the runner-up's count shrinks, so a
    wrong leader needs its own pairwise test against the true mode to cross, which the
    union over m rivals bounds (docs/method.md).
``runner-up``
    The intersection-union form of the same test: certify the leader a only when every
    pairwise null "p_b >= p_a" is rejected. The pairwise e-value falls as n_b grows, so
    the hardest rival is the runner-up and the rule is E(n_1, n_2) >= c / delta, with
    no factor for the number of classes (``c``, default 2, is the only constant).

    *What is proven.* Write E_ab for the pairwise e-value of class a against class b
    (x = n_a, y = n_b; draws outside {a, b} leave it unchanged). When p_a <= p_b it is
    a test supermartingale, so by Ville's inequality P(E_ab ever >= c/delta) <= delta/c.
    Sharper, with theta = p_a / (p_a + p_b) <= 1/2: E_ab = M (2 theta)^(x-y)
    (4 theta (1 - theta))^y, where M, the same mixture's likelihood ratio against the
    true theta, is a martingale with mean 1; and E_ab >= c/delta needs a lead
    x - y >= d, the smallest lead at which E can reach c/delta (E(x, y) <= 1 when
    x <= y, so d >= 1; d = 8 at c = 2, delta = 0.05 and the uniform prior, the 8
    samples of a unanimous item; 6 with half the prior's mass at theta' = 1). Hence
    P(E_ab ever >= c/delta) <= (2 theta)^d delta/c.
    The leader is chosen from the data, so take a wrong certification of a and a mode
    b* != a (the true mode, or another of the classes tied at the top). b* is not the
    leader, so n_b* <= n_2, and as E falls in its second argument
    E_ab* = E(n_1, n_b*) >= E(n_1, n_2) >= c/delta: the process of a against b* has
    crossed. A union over the classes that could be certified instead of the mode:

        P(wrong certification) <= m delta / c,
        m = sum over those classes a of (2 theta_a)^d,   theta_a = p_a / (p_a + p_max).

    With a unique mode the sum runs over the other classes; with an exact tie of k
    classes at the top (no mode to certify: every certification is wrong) each tied
    class counts 1. A class tied with the mode counts 1, one at half its probability
    (2/3)^8 = 0.039, so m <= (classes with positive probability) - 1 with a unique mode
    and m <= (classes with positive probability) with a tie. With c = 2 the error is
    <= delta whenever m <= 2: every distribution with a unique mode and at most three
    classes, an exact two-way tie and nothing else, or a unique mode whose rivals'
    (2 theta_a)^8 sum to at most 2 (a tail of ten classes at a tenth of the mode's
    probability adds 10 x (2/11)^8 = 1.2e-5). c = 1 is not enough on an exact two-way
    tie (bound 2 delta/c). Not proven <= delta at c = 2: exact ties of k >= 3 classes
    (bound k delta/2) or more than two classes near a unique mode; and, at the margin,
    an exact two-way tie with other classes (0.4/0.4/0.2: m = 2.04).

    *What is measured* (delta = 0.05, ``relmon simulate stopping``): the validation
    grid (``--grid``, K_max = 20, 20 000 trials a cell, exact 2-, 3- and 4-way ties
    included) has every wrong-certification rate <= delta, the largest 0.0159 on the
    exact 50/50 tie (0.4/0.4/0.2: 0.0036; three-way: 0.00065; four-way: 0); the classes
    share the draws, so each pairwise process moves slowly. Over long horizons
    (K_max = 400, 4000 trials, no futility) the exact 50/50 tie gives 0.07275 at c = 1
    (above delta) and 0.03325 at c = 2; the tie 0.35/0.35 plus ten classes at 0.03
    gives 0.05400 and 0.02225.
``truncated`` (default)
    An exact truncated test: K_max is known, so the boundary is calibrated exactly at
    the least favourable null instead of through Ville's inequality
    (:mod:`monitor.core.stopping_boundary`). Certify the leader when n1 >= b[n2] and
    n1 > n2. At the service's defaults (K_max = 20, k0 = 3, delta = 0.05) b is the
    tuned table b = 7, 9, 10 for n2 = 0..2 (none later), level 0.0498 at the two-way tie
    (``TUNED_TABLES``: chosen on the tuning answer sets by
    :func:`monitor.core.stopping_optimum.tune_table`; its level is checked <= delta when
    the rule is built). At any other setting, or with an explicit ``point_mass``, b is
    the e-value construction: the region {E_w(n1, n2) >= t} (the mixture e-value above
    with prior mass ``point_mass`` w, default 0.25, on unanimous answers, fixing only the
    order of the points) is made monotone in n2, and t is the smallest threshold whose
    exact probability of certifying anything at an exact two-way tie (two classes,
    nothing else), followed for K_max draws, is <= delta; then single points just below
    the boundary are added in the same order while that stays <= delta (no point can be
    added after that). At the defaults it would give b = 6, 10, 12, 14, level 0.0470.

    *What is proven.* Certifying a class a needs n_a >= b[n2] >= b[n_c] and
    n_a > n2 >= n_c for every other class c (b is non-decreasing), so the process of
    a against c, which sees only the draws in {a, c}, has entered the region within
    its first K_max draws. At an exact two-way tie {a, b} plus any smaller classes the
    draws in {a, b} are fair coin flips, so certifying a or b is at most the level
    (<= delta), whatever the other classes do; certifying a smaller class c needs its
    walk against a to cross while drifting away, a small extra term. A unique mode's
    wrong certifications tend to those of the tie as the gap closes.
    *What is computed* (exact enumeration, :func:`certification_probability`, and
    simulation for long tails), for the tuned table: the largest wrong-mode rate over
    the validation grid with 3- and 4-way ties and tie + tail is the two-way tie itself
    (0.0498); 0.4/0.4/0.2 gives 0.021, three-way 0.0085, four-way 0.0025,
    0.49/0.49/0.02 0.049. The futility
    stop never changes what is certified, and k0 is inside the region (b[0] >= k0).
    With the futility stop, batches are cut at the first draw after which futility could
    stop the item, so batching samples exactly what one draw at a time would.
``hoeffding``
    The paper's section 9 theorem 'Certified mode identification' (cited elsewhere
    as Theorem 8.1) exactly as printed: stop when
    Delta_k > sqrt(2 ln(2 |C| k^2 / delta) / k). At delta = 0.05 its threshold stays
    above 1 until k = 20 even for unanimous answers, so with K_max = 20 it never saves
    a sample. Kept for comparison.
``fixed``
    Always K_max samples (the non-sequential baseline).

Futility (``futility=True``, any rule)
    Also stop, uncertified, as soon as certification by K_max has become impossible:
    even if every remaining sample went to the leader the criterion would not hold.
    It looks only at the counts (never the label), so conformal validity is kept, and
    it certifies exactly the items the rule without it certifies; its uncertified
    items simply carry fewer samples (a coarser ranking).

Every rule also says how many more samples to ask for (:meth:`StoppingRule.next_batch`):
the fewest that could possibly let it stop, assuming all of them agree with the leader,
so the service can batch requests without ever sampling past the point where it
would have stopped one sample at a time.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from monitor.core.errors import ConfigError, InputError
from monitor.core.stopping_boundary import TruncatedBoundary, earliest_stop, truncated_boundary
from monitor.core.stopping_evalue import mixture_log_e_value

__all__ = [
    "DEFAULT_FUTILITY",
    "DEFAULT_RULE",
    "Decision",
    "FixedRule",
    "HoeffdingRule",
    "MixtureRule",
    "RunnerUpRule",
    "StoppingRule",
    "TruncatedRule",
    "available_rules",
    "fewest_samples",
    "get_stopping_rule",
    "mixture_log_e_value",
]

DEFAULT_RULE = "truncated"
DEFAULT_FUTILITY = True
"""The service's defaults (a task's ``stopping_rule`` and ``futility``): chosen from the
real-answer replay (``bench/stopping_bench.py``, ``relmon simulate stopping --real``):
the truncated rule (tuned table) with the futility stop saves about 50% of calls at
K_max = 20 on SmolLM2's first answers (9.93 calls an item; ``runner-up``, the previous
default, 11.95) and 45% on the held-out ones, and certifies more items early (0.597
against 0.534), at a wrong-mode rate <= delta on every distribution of the validation
grid, exact ties included."""


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do after looking at the counts so far.

    ``stop``: sample no more. ``certified``: the rule's criterion holds (stopping
    because K_max is reached is ``stop`` without ``certified``). ``more``: how many
    samples to request next (0 when stopping).
    """

    stop: bool
    certified: bool
    more: int


def _sorted_counts(counts: Iterable[int]) -> list[int]:
    raw = [int(x) for x in counts]
    if any(x < 0 for x in raw):
        raise InputError("counts must be >= 0")
    return sorted((x for x in raw if x > 0), reverse=True)


class StoppingRule(Protocol):
    """The interface the re-issuer drives."""

    @property
    def name(self) -> str: ...

    @property
    def k0(self) -> int: ...

    @property
    def k_max(self) -> int: ...

    @property
    def delta(self) -> float: ...

    def certified(self, counts: Iterable[int]) -> bool:
        """Whether the criterion holds for these class counts (any order)."""
        ...

    def decide(self, counts: Iterable[int]) -> Decision:
        """Stop or not, and how many samples to ask for next."""
        ...


class _RuleBase(ABC):
    """Shared bookkeeping: k0, K_max, delta, and batching by look-ahead."""

    name = "base"

    def __init__(
        self, *, k0: int = 3, k_max: int = 20, delta: float = 0.05, futility: bool = False
    ) -> None:
        self.futility = bool(futility)
        if not 1 <= k0 <= k_max:
            raise ConfigError(f"need 1 <= k0 <= k_max, got k0={k0}, k_max={k_max}")
        if not 0.0 < delta < 1.0:
            raise ConfigError(f"delta must be in (0, 1), got {delta}")
        self._k0, self._k_max, self._delta = int(k0), int(k_max), float(delta)

    @property
    def k0(self) -> int:
        return self._k0

    @property
    def k_max(self) -> int:
        return self._k_max

    @property
    def delta(self) -> float:
        return self._delta

    @abstractmethod
    def _criterion(self, counts: list[int]) -> bool:
        """The rule's test on sorted, positive counts (k >= k0 already checked)."""

    def certified(self, counts: Iterable[int]) -> bool:
        c = _sorted_counts(counts)
        return sum(c) >= self._k0 and bool(c) and self._criterion(c)

    def decide(self, counts: Iterable[int]) -> Decision:
        c = _sorted_counts(counts)
        k = sum(c)
        if k >= self._k0 and c and self._criterion(c):
            return Decision(stop=True, certified=True, more=0)
        if k >= self._k_max:
            return Decision(stop=True, certified=False, more=0)
        room = self._k_max - k
        if not c:
            return Decision(stop=False, certified=False, more=min(room, self._k0))
        # The fewest further samples that could certify: all of them to the leader.
        for j in range(1, room + 1):
            if k + j >= self._k0 and self._criterion([c[0] + j, *c[1:]]):
                return Decision(stop=False, certified=False, more=j)
        if self.futility and k >= self._k0:
            return Decision(stop=True, certified=False, more=0)  # K_max cannot certify
        return Decision(stop=False, certified=False, more=room)


class MixtureRule(_RuleBase):
    """Anytime-valid pairwise mixture test of leader against runner-up, union over rivals."""

    name = "mixture"

    def __init__(
        self,
        *,
        k0: int = 3,
        k_max: int = 20,
        delta: float = 0.05,
        point_mass: float = 0.0,
        strict: bool = False,
        futility: bool = False,
    ) -> None:
        super().__init__(k0=k0, k_max=k_max, delta=delta, futility=futility)
        if not 0.0 <= point_mass < 1.0:
            raise ConfigError(f"point_mass must be in [0, 1), got {point_mass}")
        self.point_mass = float(point_mass)
        self.strict = bool(strict)

    def rivals(self, counts: list[int]) -> int:
        """m: the number of rivals the union bound allows for."""
        return max(1, self._k_max - 1 if self.strict else len(counts) - 1)

    def log_e_value(self, counts: Iterable[int]) -> float:
        c = _sorted_counts(counts)
        if not c:
            return 0.0
        return mixture_log_e_value(c[0], c[1] if len(c) > 1 else 0, self.point_mass)

    def _criterion(self, counts: list[int]) -> bool:
        x, y = counts[0], counts[1] if len(counts) > 1 else 0
        log_e = mixture_log_e_value(x, y, self.point_mass)
        return log_e >= math.log(self.rivals(counts) / self._delta)


class RunnerUpRule(MixtureRule):
    """Intersection-union rule: E(leader, runner-up) >= c / delta, c fixed (default 2)."""

    name = "runner-up"

    def __init__(
        self,
        *,
        k0: int = 3,
        k_max: int = 20,
        delta: float = 0.05,
        point_mass: float = 0.0,
        c: float = 2.0,
        futility: bool = False,
    ) -> None:
        super().__init__(k0=k0, k_max=k_max, delta=delta, point_mass=point_mass, futility=futility)
        if not (math.isfinite(c) and c >= 1.0):
            raise ConfigError(f"c must be >= 1, got {c}")
        self.c = float(c)

    def rivals(self, counts: list[int]) -> int:
        return 1

    def _criterion(self, counts: list[int]) -> bool:
        x, y = counts[0], counts[1] if len(counts) > 1 else 0
        return mixture_log_e_value(x, y, self.point_mass) >= math.log(self.c / self._delta)


class TruncatedRule(_RuleBase):
    """The exact truncated test: n1 >= b[n2], b calibrated at the two-class tie."""

    name = "truncated"

    def __init__(
        self,
        *,
        k0: int = 3,
        k_max: int = 20,
        delta: float = 0.05,
        point_mass: float | None = None,
        futility: bool = False,
    ) -> None:
        super().__init__(k0=k0, k_max=k_max, delta=delta, futility=futility)
        self.boundary: TruncatedBoundary = truncated_boundary(
            self._k_max, self._k0, self._delta, None if point_mass is None else float(point_mass)
        )

    def _criterion(self, counts: list[int]) -> bool:
        return self.boundary.certifies(counts[0], counts[1] if len(counts) > 1 else 0)

    def decide(self, counts: Iterable[int]) -> Decision:
        """As every rule decides, but with the futility stop the batch is also cut at the
        first draw after which futility could stop the item (:func:`earliest_stop`), so
        batching never samples past where one draw at a time would have stopped."""
        if not self.futility:
            return super().decide(counts)
        c = _sorted_counts(counts)
        k = sum(c)
        leader, runner_up = (c[0] if c else 0), (c[1] if len(c) > 1 else 0)
        more = earliest_stop(self.boundary, leader, runner_up, k)
        if more > 0:
            return Decision(stop=False, certified=False, more=more)
        return Decision(stop=True, certified=self.boundary.certifies(leader, runner_up), more=0)


class HoeffdingRule(_RuleBase):
    """The paper's Hoeffding stopping time (section 9), as printed."""

    name = "hoeffding"

    def _criterion(self, counts: list[int]) -> bool:
        k = sum(counts)
        margin = (counts[0] - (counts[1] if len(counts) > 1 else 0)) / k
        bound = math.sqrt(2.0 * math.log(2.0 * len(counts) * k * k / self._delta) / k)
        return margin > bound


class FixedRule(_RuleBase):
    """Never certifies: always K_max samples, asked for in one batch (no futility stop:
    with a rule that never certifies it would stop every item at k0)."""

    name = "fixed"

    def __init__(
        self, *, k0: int = 3, k_max: int = 20, delta: float = 0.05, futility: bool = False
    ) -> None:
        super().__init__(k0=k0, k_max=k_max, delta=delta, futility=False)

    def _criterion(self, counts: list[int]) -> bool:
        return False


_RULES: dict[str, Callable[..., StoppingRule]] = {
    "mixture": MixtureRule,
    "runner-up": RunnerUpRule,
    "truncated": TruncatedRule,
    "hoeffding": HoeffdingRule,
    "fixed": FixedRule,
}


def available_rules() -> list[str]:
    return sorted(_RULES)


def get_stopping_rule(name: str = DEFAULT_RULE, **options: Any) -> StoppingRule:
    """A rule by name with ``k0``, ``k_max``, ``delta`` and rule-specific options."""
    try:
        factory = _RULES[name]
    except KeyError:
        raise ConfigError(
            f"unknown stopping rule {name!r}; available: {', '.join(available_rules())}"
        ) from None
    try:
        return factory(**options)
    except TypeError as exc:
        raise ConfigError(f"bad options for stopping rule {name!r}: {exc}") from None


def fewest_samples(rule: StoppingRule) -> int:
    """The fewest samples after which ``rule`` can stop an item, whatever its answers
    (every split of k answers into classes is tried, k = 1, 2, ...): with every item
    using at least this many calls, a budget of r calls/s starts at most r / this many
    items a second in the long run."""
    for k in range(1, rule.k_max + 1):
        if any(rule.decide(split).stop for split in _partitions(k, k)):
            return k
    return rule.k_max


def _partitions(n: int, largest: int) -> Iterator[list[int]]:
    """The splits of ``n`` answers into class counts, largest first, none above ``largest``."""
    if n == 0:
        yield []
        return
    for first in range(min(n, largest), 0, -1):
        for rest in _partitions(n - first, first):
            yield [first, *rest]
