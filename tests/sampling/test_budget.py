"""Pruning and adaptive K (rsft.sampling.budget): the rules, and the sampler acting on them.

The central property: sampling with pruning keeps exactly what replaying the same schedule on the
exhaustive sample set keeps (the replay tool relies on it), at any batch_rows and with any draft."""

from __future__ import annotations

import pytest

from rsft.sampling.budget import (
    PRUNED,
    PruneSchedule,
    allocate,
    expected_best,
    rows_to_stop,
    scored_tokens,
)
from rsft.sampling.proposers import ModelDraft, NgramDraft
from rsft.sampling.batched import Sampler, SamplingSettings
from tests.sampling.test_sampler import feature_draft, tiny_lm

PROMPTS = [[1, 2, 3, 4, 1], [2, 5], [5, 5, 6], [7], [3, 1, 4, 1, 5]]


def token_score(prompt_index: int, tokens: list[int]) -> float:
    """A deterministic stand-in reward: prefers token 3 and a few tokens per prompt."""
    return tokens.count(3) - 0.1 * abs(len(tokens) - 4) + 0.01 * prompt_index


def score_all(requests):
    return [token_score(p, t) for p, t in requests]


def replay(completions, schedule: PruneSchedule) -> dict[tuple[int, int], int]:
    """What pruning stops, computed from exhaustive completions: (prompt, sample) -> checkpoint."""
    by_prompt: dict[int, list] = {}
    for c in completions:
        by_prompt.setdefault(c.prompt_index, []).append(c)
    stopped = {}
    for p, group in by_prompt.items():
        alive = list(group)
        for c in schedule.checkpoints:
            scored = [scored_tokens(x.token_ids, x.finish_reason == "eos", c) for x in alive]
            if all(done for _, done in scored):
                continue
            values = [token_score(p, t) for t, _ in scored]
            out = rows_to_stop(values, [not d for _, d in scored], schedule.share, schedule.rank_finished)
            for i in out:
                stopped[(p, alive[i].sample_idx)] = c
            alive = [x for i, x in enumerate(alive) if i not in out]
    return stopped


def test_rows_to_stop_ranks_together_or_apart():
    scores, live = [5.0, 1.0, 3.0, 0.0], [False, True, True, True]
    assert rows_to_stop(scores, live, 0.5, rank_finished=True) == [1, 3]  # top 2 stay: 0 (finished) and 2
    assert rows_to_stop(scores, live, 0.5, rank_finished=False) == [3]  # floor(0.5 x 3 live) = 1 stops
    assert rows_to_stop([1.0, 2.0], [True, True], 0.9, rank_finished=False) == [0]  # never all live rows
    assert rows_to_stop([1.0], [True], 0.9, rank_finished=True) == []  # at least one candidate stays
    assert rows_to_stop([2.0, 2.0, 2.0, 2.0], [True] * 4, 0.5, rank_finished=True) == [2, 3]  # ties keep lower index


def test_scored_tokens_takes_the_finished_answer_only_when_it_ended_by_the_checkpoint():
    assert scored_tokens([1, 2, 3], True, 4) == ([1, 2, 3], True)
    assert scored_tokens([1, 2, 3, 4, 5], True, 4) == ([1, 2, 3, 4], False)
    assert scored_tokens([1, 2, 3, 4, 5], False, 4) == ([1, 2, 3, 4], False)


def test_schedule_refuses_bad_checkpoints_and_shares():
    with pytest.raises(ValueError, match="ascending"):
        PruneSchedule((8, 4)).check(16)
    with pytest.raises(ValueError, match="below sample.max_new_tokens"):
        PruneSchedule((4, 16)).check(16)
    with pytest.raises(ValueError, match="share"):
        PruneSchedule((4,), share=1.0).check(16)


@pytest.mark.parametrize("rank_finished", [True, False])
@pytest.mark.parametrize("draft_kind", ["none", "model", "ngram", "feature"])
@pytest.mark.parametrize("batch_rows", [3, 16])
def test_pruned_sampling_keeps_what_the_replay_of_the_exhaustive_set_keeps(draft_kind, batch_rows, rank_finished):
    target = tiny_lm(9, seed=0)
    schedule = PruneSchedule((3, 6), share=0.5, rank_finished=rank_finished)
    gamma = 0 if draft_kind == "none" else 2
    settings = SamplingSettings(max_new_tokens=10, temperature=1.0, batch_rows=batch_rows, gamma=gamma)

    def draft():
        return {"none": None, "model": ModelDraft(tiny_lm(9, seed=5, layers=1)), "ngram": NgramDraft(),
                "feature": feature_draft(target)}[draft_kind]

    full = Sampler(target, settings, eos_token_ids=[2], draft=draft()).generate(PROMPTS, 6, seed=3, progress=False)
    sampler = Sampler(target, settings, eos_token_ids=[2], draft=draft(), prune=schedule, score=score_all)
    pruned = sampler.generate(PROMPTS, 6, seed=3, progress=False)
    assert [(c.prompt_index, c.sample_idx) for c in pruned] == [(c.prompt_index, c.sample_idx) for c in full]
    if draft_kind == "ngram":  # proposals depend on siblings, so only the rule, not the tokens, can be compared
        assert any(c.finish_reason == PRUNED for c in pruned)
        return
    expected = replay(full, schedule)
    assert expected, "the schedule stops nothing here: the test would prove nothing"
    for exhaustive, c in zip(full, pruned):
        key = (c.prompt_index, c.sample_idx)
        if key in expected:
            assert c.finish_reason == PRUNED and c.pruned_at == expected[key], key
            assert c.token_ids[:c.pruned_at] == exhaustive.token_ids[:c.pruned_at]  # its prefix is recorded
        else:
            assert (c.token_ids, c.finish_reason) == (exhaustive.token_ids, exhaustive.finish_reason), key
    assert sampler.summary()["prune_rows_stopped"] == len(expected)
    assert sum(len(c.token_ids) for c in pruned) < sum(len(c.token_ids) for c in full)


def test_every_prompt_keeps_at_least_one_row_at_any_share():
    target = tiny_lm(9, seed=0)
    settings = SamplingSettings(max_new_tokens=10, temperature=1.0, batch_rows=8)
    sampler = Sampler(target, settings, eos_token_ids=[2], prune=PruneSchedule((2, 4, 6), share=0.9),
                      score=score_all)
    completions = sampler.generate(PROMPTS, 5, seed=1, progress=False)
    for p in range(len(PROMPTS)):
        assert any(c.finish_reason != PRUNED for c in completions if c.prompt_index == p)


def test_second_pass_draws_the_same_completions_as_one_pass():
    """Adaptive K's second pass (sample_ranges) draws completion (p, k) exactly as a single pass does."""
    target = tiny_lm(9, seed=0)
    settings = SamplingSettings(max_new_tokens=8, temperature=1.0, batch_rows=4)
    one = Sampler(target, settings, eos_token_ids=[2]).generate(PROMPTS, 4, seed=9, progress=False)
    first = Sampler(target, settings, eos_token_ids=[2]).generate(PROMPTS, 2, seed=9, progress=False)
    more = Sampler(target, settings, eos_token_ids=[2]).generate(
        PROMPTS, 0, seed=9, progress=False, sample_ranges=[range(2, 4), range(2, 3), range(0), range(2, 4),
                                                             range(2, 4)])
    table = {(c.prompt_index, c.sample_idx): c.token_ids for c in one}
    for c in first + more:
        assert c.token_ids == table[(c.prompt_index, c.sample_idx)]
    assert len(more) == 7


def test_expected_best_matches_the_normal_order_statistic():
    # E[max of 2 standard normals] = 1 / sqrt(pi); from a current best far below, the gain is that mean
    assert expected_best(-50.0, 0.0, 1.0, 1.0, 2, points=4000) == pytest.approx(-50 + 50 + 0.5642, abs=2e-3)
    assert expected_best(0.0, 0.0, 1.0, 1.0, 0) == 0.0


def test_allocate_spends_where_the_pick_can_still_change():
    # prompt 0: a clear best far above its spread; prompt 1: tight and close; prompt 2: nothing keepable yet
    scores = [[3.0, 0.0, 0.1], [1.0, 0.9, 1.1], [0.5, 0.4, 0.6]]
    keepable = [[True] * 3, [True] * 3, [False] * 3]
    out = allocate(scores, keepable, extra=6, max_per_prompt=6)
    assert sum(out.counts) == 9 + 6 and max(out.counts) <= 6
    assert out.counts[2] == 6 and out.counts[0] == 3  # empty first; a settled pick gets nothing
    assert all(a >= b - 1e-12 for a, b in zip(out.gains, out.gains[1:]))  # greedy: gains never rise


def test_allocate_caps_what_was_drawn_not_what_was_scored():
    """Pruning stopped two of four first samples: the cap counts all four draws."""
    out = allocate([[0.0, 1.0], [0.5, 0.6]], [[True, True], [True, True]], extra=20, max_per_prompt=6,
                   drawn=[4, 4])
    assert out.counts == [6, 6] and len(out.gains) == 4
