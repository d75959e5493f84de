"""Config advice: it appears exactly for the wasteful combinations, and its fixes silence it."""

from __future__ import annotations

import attrs
from hypothesis import given
from hypothesis import strategies as st

from gm_core.advice import advise, advise_node
from gm_core.records import AlgorithmConfig, Alignment

configs = st.builds(
    AlgorithmConfig,
    sync_every=st.integers(1, 200),
    fragments=st.integers(1, 8),
    in_flight=st.integers(1, 16),
    overlap_steps=st.none() | st.integers(0, 50),
    alignment=st.sampled_from(Alignment),
)


@given(configs)
def test_zero_step_advice_is_given_exactly_when_the_mechanism_applies(c: AlgorithmConfig) -> None:
    wasteful = (
        c.alignment is not Alignment.CARRY
        and c.overlap_steps is None
        and c.in_flight % c.fragments == 0
    )
    assert [a.code for a in advise(c)] == (["zero_step_rounds"] if wasteful else [])


@given(configs)
def test_every_fix_the_advice_names_silences_it(c: AlgorithmConfig) -> None:
    for advice in advise(c):
        fixes = advice.fix.removeprefix("set ").split(", or ")
        assert fixes[0] == "alignment='carry'"
        assert advise(attrs.evolve(c, alignment=Alignment.CARRY)) == ()
        for fix in fixes[1:]:
            name, _, value = fix.partition("=")
            assert name == "in_flight"
            assert advise(attrs.evolve(c, in_flight=int(value))) == (), fix
        assert str(advice).startswith(f"alignment={c.alignment.value} in_flight={c.in_flight}")


def test_the_default_session_config_is_not_wasteful() -> None:
    from gm_shell import DiLoCo

    assert advise(DiLoCo(sync_every=100).config()) == ()
    assert advise(DiLoCo(sync_every=100, fragments=4).config()) == ()
    overwrite = DiLoCo(sync_every=100, alignment="overwrite").config()
    (only,) = advise(overwrite)
    assert str(only) == (
        "alignment=overwrite in_flight=2 fragments=1 overlap_steps=None: whenever commits lag"
        " training by a round, a learner's next snapshot of that fragment holds zero steps and"
        " is rejected (zero_steps), and the steps it trained since its previous snapshot are"
        " lost; set alignment='carry'"
    )


@given(
    configs,
    st.none() | st.floats(0.0, 1e4, allow_nan=False),
    st.floats(0.001, 1e4, allow_nan=False),
)
def test_grace_advice_is_given_exactly_when_the_window_outlasts_the_stall_timeout(
    c: AlgorithmConfig, grace_s: float | None, stall_s: float
) -> None:
    c = attrs.evolve(c, grace_seconds=grace_s)
    outlasts = grace_s is not None and grace_s >= stall_s
    found = advise_node(c, stall_s)
    assert [a.code for a in found] == (["grace_outlasts_stall"] if outlasts else [])
    for advice in found:
        assert advise_node(c, stall_s) == found
        assert "StalledError" in str(advice)
