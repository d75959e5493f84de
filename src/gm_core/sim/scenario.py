"""Scenario values: everything one simulation run depends on besides its seed.

Theory of operation
-------------------
A :class:`Scenario` is a frozen value naming the fleet (learners, closers, whether
closers share a learner's host), the protocol config the run is created with, the
node-local options, the model object store (:class:`StoreProfile`: latency per
request class, list lag, failures, lost responses, throttling), the learners'
speeds (:class:`SpeedProfile`), a fault schedule (explicit :class:`Fault` entries
plus :class:`RandomFaults` drawn from the seed), and optionally a small model that
really trains (:class:`TrainingSpec`; without one, tensors stay abstract).

Scenarios are written by hand as JSON or TOML; :func:`from_mapping` turns the
parsed document into a value strictly (an unknown or misspelled field is an
error, so a typo never silently runs the default), and :func:`to_mapping` is its
inverse so a run's scenario can be saved and replayed exactly.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import attrs
import cattrs

from gm_core.records import AlgorithmConfig


class RequestClass(enum.StrEnum):
    """How the simulated store prices and times a request."""

    GET = "get"
    PROBE = "probe"
    PUT = "put"
    LIST = "list"
    DELETE = "delete"


@attrs.frozen(kw_only=True)
class Latency:
    """A lognormal request latency: ``median_s · exp(sigma · N(0, 1))``."""

    median_s: float = 0.02
    sigma: float = 0.3


def _default_latency() -> Mapping[RequestClass, Latency]:
    return {
        RequestClass.GET: Latency(median_s=0.02),
        RequestClass.PROBE: Latency(median_s=0.015),
        RequestClass.PUT: Latency(median_s=0.04),
        RequestClass.LIST: Latency(median_s=0.05),
        RequestClass.DELETE: Latency(median_s=0.03),
    }


@attrs.frozen(kw_only=True)
class StoreProfile:
    """The model object store's behaviour, per request.

    ``fail_rate``: a request fails outright (nothing happened). ``lost_rate``: a
    write lands but its response is lost, so the writer sees a failure.
    ``throttle_rps``: at most this many requests of one class per second across the
    run; the excess fails as S3's 503 SlowDown does. ``list_lag_s``: a new key
    shows up in listings only this long after its creation (reads see it at once).
    ``bandwidth_bps`` and ``fragment_bytes`` size payload transfers.
    """

    latency: Mapping[RequestClass, Latency] = attrs.field(factory=_default_latency)
    fail_rate: float = 0.0
    lost_rate: float = 0.0
    throttle_rps: float | None = None
    list_lag_s: float = 0.0
    bandwidth_bps: float = 1e9
    fragment_bytes: int = 4 * 1024 * 1024
    merge_bps: float = 1e9


@attrs.frozen(kw_only=True)
class SpeedProfile:
    """How long a learner's optimizer step takes.

    Learner ``i``'s mean step time is ``step_s``, times ``slow_factor`` for the first
    ``round(slow_share · learners)`` learners (heterogeneous hardware), times a
    per-learner lognormal factor of spread ``spread``. Each step then varies
    uniformly by ``± jitter`` of that mean.
    """

    step_s: float = 1.0
    jitter: float = 0.0
    slow_share: float = 0.0
    slow_factor: float = 1.0
    spread: float = 0.0


class FaultKind(enum.StrEnum):
    CRASH = "crash"  # the node dies; restarts after duration_s when duration_s > 0
    SLOW = "slow"  # steps take `factor` times longer for duration_s
    PAUSE = "pause"  # the learner trains nothing for duration_s (its host stays up)
    CUTOFF = "cutoff"  # every store request of the node fails for duration_s
    JOIN = "join"  # the node starts only at at_s
    CLOSE = "close"  # the node leaves cleanly at at_s
    POISON = "poison"  # from at_s the learner publishes deltas holding a NaN
    HOSTILE = "hostile"  # garbage lands in the current round's snapshot folder


@attrs.frozen(kw_only=True)
class Fault:
    kind: FaultKind
    node: str
    at_s: float
    duration_s: float = 0.0
    factor: float = 1.0


@attrs.frozen(kw_only=True)
class RandomFaults:
    """Faults drawn from the seed: Poisson arrivals per node, exponential durations."""

    crash_per_h: float = 0.0
    down_s: float = 30.0
    slow_per_h: float = 0.0
    slow_s: float = 60.0
    slow_factor: float = 3.0
    cutoff_per_h: float = 0.0
    cutoff_s: float = 20.0
    pause_per_h: float = 0.0
    pause_s: float = 20.0


class ModelKind(enum.StrEnum):
    LINEAR = "linear"
    MLP = "mlp"


@attrs.frozen(kw_only=True)
class TrainingSpec:
    """A small regression model each learner trains on its own shard.

    ``skew`` shifts each shard's inputs apart (0: i.i.d. shards), so learners'
    deltas disagree as they would on real non-i.i.d. data.
    """

    model: ModelKind = ModelKind.MLP
    inputs: int = 8
    hidden: int = 16
    shard_size: int = 512
    test_size: int = 512
    batch: int = 16
    lr: float = 0.05
    noise: float = 0.1
    skew: float = 0.5


class CheckPolicy(enum.StrEnum):
    EVERY = "every"  # every invariant after every action
    END = "end"  # only once, at the end of the run
    NONE = "none"


@attrs.frozen(kw_only=True)
class Scenario:
    name: str = "default"
    seed: int = 0
    learners: int = 4
    closers: int = 1
    colocate: bool = True
    duration_s: float = 600.0
    config: AlgorithmConfig = attrs.field(
        factory=lambda: AlgorithmConfig(sync_every=20, fragments=2, quorum=1, in_flight=2)
    )
    poll_s: float = 1.0
    renew_s: float = 5.0
    tokens_per_step: int = 1024
    store: StoreProfile = attrs.field(factory=StoreProfile)
    speed: SpeedProfile = attrs.field(factory=SpeedProfile)
    faults: tuple[Fault, ...] = ()
    random_faults: RandomFaults = attrs.field(factory=RandomFaults)
    training: TrainingSpec | None = None
    check: CheckPolicy = CheckPolicy.EVERY
    sample_s: float | None = None


_converter = cattrs.Converter(forbid_extra_keys=True)


def from_mapping(doc: Mapping[str, Any]) -> Scenario:
    """A scenario from a parsed JSON/TOML document; unknown fields are errors."""
    try:
        return _converter.structure(dict(doc), Scenario)
    except cattrs.BaseValidationError as error:
        notes = "; ".join(_flatten(error))
        raise ValueError(f"invalid scenario: {notes or error}") from None


def _flatten(error: BaseException) -> list[str]:
    """cattrs nests errors in groups with notes; a user wants one line per problem."""
    if isinstance(error, BaseExceptionGroup):
        out: list[str] = []
        for sub in error.exceptions:
            where = " ".join(str(n) for n in getattr(sub, "__notes__", []))
            out.extend(f"{where}: {m}" if where else m for m in _flatten(sub))
        return out
    return [str(error)]


def to_mapping(scenario: Scenario) -> dict[str, Any]:
    """The scenario as plain data (enums as strings), the inverse of :func:`from_mapping`."""
    out: dict[str, Any] = _converter.unstructure(scenario)
    return out
