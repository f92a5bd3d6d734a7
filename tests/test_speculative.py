"""Draft-length choice for prompt lookup (engine/speculative.py): pure logic,
plus the idle calibration on the real model."""

from __future__ import annotations

import time

from turbospark.engine.model import LlamaChatModel, ModelOptions
from turbospark.engine.speculative import NEIGHBOUR_TAX, NgramDrafter, StepCosts, best_draft_length
from turbospark.models.catalog import resolve_model

# step seconds shaped like the CPU kernels measured here: columns in tiles of 4
TILED = {
    1: 0.020,
    2: 0.040,
    3: 0.045,
    4: 0.048,
    5: 0.066,
    6: 0.075,
    7: 0.080,
    8: 0.083,
    9: 0.103,
    12: 0.104,
    16: 0.120,
    17: 0.150,
}


def tiled() -> StepCosts:
    c = StepCosts()
    c.calibrate(TILED)
    return c


def test_costs_unknown_until_calibrated_then_measured_interpolated_extrapolated():
    c = StepCosts()
    c.observe(1, 0.02)  # online samples alone do not make a table
    assert c.estimate(1) is None
    c = tiled()
    assert c.estimate(4) == 0.048
    assert abs(c.estimate(10) - (0.103 + (0.104 - 0.103) / 3)) < 1e-12  # between 9 and 12
    assert abs(c.estimate(34) - 0.150 * 34 / 17) < 1e-12  # per-token cost of the largest
    short = StepCosts(limit=20)
    short.calibrate(TILED)
    assert abs(short.estimate(40) - 0.150 * 40 / 17) < 1e-12  # beyond the table's limit too
    c.observe(4, 0.058)  # moving average once ready
    assert 0.048 < c.estimate(4) < 0.058


def test_without_a_table_every_available_draft_is_verified():
    assert best_draft_length(StepCosts(), 0, 7, 0.1) == 7


def test_draft_length_follows_cost_tiles_and_acceptance():
    c = tiled()
    # likely acceptance: fill the 4-column tile rather than stop at 2 tokens
    assert best_draft_length(c, 0, 8, 0.9) == 3
    # near-certain acceptance: the long, cheap-per-token step wins
    assert best_draft_length(c, 0, 15, 0.98) == 15
    # a sequence that is not copying does not pay for drafts
    assert best_draft_length(c, 0, 8, 0.3) == 0
    # nearly free extra tokens (a GPU): verify the whole match
    flat = StepCosts()
    flat.calibrate({n: 0.010 + 0.0001 * n for n in range(1, 20)})
    assert best_draft_length(flat, 0, 12, 0.9) == 12
    assert best_draft_length(flat, 0, 12, 0.5) >= 4 > best_draft_length(c, 0, 12, 0.5)


def test_drafts_are_priced_for_every_sequence_in_the_step():
    """Beside other decoders, all drafts together may slow the step by at
    most NEIGHBOUR_TAX: a neighbour never pays 13x for someone's drafts."""
    c = tiled()
    # alone, a copying sequence drafts (its own gain is the batch's)
    assert c.affordable(1) >= 1 and best_draft_length(c, 0, 8, 0.9) == 3
    # beside one neighbour on the tiled CPU: 3 tokens cost 1.125x of 2, more
    # than the tax allows, so nobody drafts however well it copies
    assert NEIGHBOUR_TAX < 0.125 and c.affordable(2) == 2
    # four decoders fill their tile: the tile's free columns may carry drafts
    assert c.affordable(4) == 4 and c.affordable(5) == 5
    assert c.affordable(6) == 6  # 7 tokens would cost 1.07x of 6: over the tax
    assert c.affordable(9) == 12  # 12 tokens cost 1.01x of 9
    # without cost data, nobody drafts beside a neighbour
    assert StepCosts().affordable(3) == 3
    # nearly free extra tokens (a GPU): neighbours lose little, drafts go on
    flat = StepCosts()
    flat.calibrate({n: 0.010 + 0.0001 * n for n in range(1, 65)})
    assert flat.affordable(2) >= 6  # 6 tokens cost 1.04x of 2


def test_two_decoders_on_a_tiled_cpu_do_not_draft_but_one_alone_does():
    """The scheduler caps every drafter at what the step can afford: on the
    tiled CPU table, a copying sequence drafts alone and not beside another."""
    import asyncio

    from turbospark.engine.types import CancelFlag, GenerationConfig

    path, _ = resolve_model("smollm2-135m")
    model = LlamaChatModel(ModelOptions(path=path, id="priced", parallel=2, session_slots=2))
    sch = model.scheduler
    try:
        with sch._cond:
            sch._calibration.abandon()  # no idle timing: the table is imposed

        class Imposed(StepCosts):
            def observe(self, n: int, dt: float) -> None:
                pass  # kept as imposed

        sch.step_costs = Imposed(sch.step_costs.limit)
        sch.step_costs.calibrate(TILED)
        text = "alpha beta gamma delta epsilon. " * 30
        ids = model.prompt_ids("Repeat: " + text + "\n" + text[:60])
        cfg = dict(temperature=0, max_new_tokens=48, ignore_eos=True)

        async def one() -> int:
            r = await model.run_completion(ids, GenerationConfig(**cfg), None, CancelFlag(), lambda p: None)
            return r.drafted_tokens

        async def two() -> list[int]:
            return list(await asyncio.gather(one(), one()))

        alone = asyncio.run(one())
        assert alone > 0  # copying, alone: worth drafting
        assert asyncio.run(two()) == [0, 0]  # beside each other: nobody pays for drafts
    finally:
        model.close()


def test_drafter_estimate_falls_on_misses_and_probes_again():
    d = NgramDrafter([1, 2, 3, 4, 5, 1, 2, 3], k_max=4)
    assert d.draft(10) == [4, 5, 1, 2]
    before = d.accept
    for _ in range(12):
        d.feedback(3, 0)
    assert d.accept < 0.3 < before
    c = tiled()
    picks = [d.choose(c, 0, [4, 5, 1, 2]) for _ in range(8)]
    assert picks[:7] == [[]] * 7  # not worth it ...
    assert picks[7] == [4, 5, 1]  # ... but probed, at the length that would pay
    for _ in range(20):
        d.feedback(3, 3)
    assert d.accept > 0.9 and d.choose(c, 0, [4, 5, 1, 2]) == [4, 5, 1]


def test_idle_engine_times_its_decode_steps():
    path, _ = resolve_model("smollm2-135m")
    model = LlamaChatModel(ModelOptions(path=path, id="calib", parallel=1, draft_max=4))
    try:
        costs = model.scheduler.step_costs
        deadline = time.monotonic() + 60
        while not costs.ready and time.monotonic() < deadline:
            time.sleep(0.1)
        assert costs.ready
        measured = [costs.seconds[n] for n in range(1, 6)]
        assert all(s is not None and 0 < s < 5 for s in measured)
    finally:
        model.close()


def test_drafter_keeps_copying_from_its_source_in_repetitive_text():
    # similar lines "7 5 5 5 <n>" after a unique header
    prompt = [100, 101, 102, 7, 5, 5, 5, 1, 7, 5, 5, 5, 2, 50]
    d = NgramDrafter(prompt, k_max=16)
    for t in (100, 101, 102):  # the output starts copying the prompt
        d.push(t)
    assert d.draft(16)[:6] == [7, 5, 5, 5, 1, 7]
    for t in (7, 5, 5, 5, 1, 7, 5, 5, 5):  # accepted so far
        d.push(t)
    # every n-gram of the suffix was last seen in the line just written
    # (followed by 1); the source being copied continues with 2
    assert d.draft(2) == [2, 50]
    d.push(9)  # the model wrote something else: the alignment is dropped
    assert d.src is None


def test_a_repeating_tail_drafts_past_its_own_end():
    d = NgramDrafter([7, 8, 9], k_max=16)
    for t in (7, 8, 9):
        d.push(t)
    # the source is 3 tokens back: the text repeats with period 3
    assert d.draft(7) == [7, 8, 9, 7, 8, 9, 7]
