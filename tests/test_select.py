"""stage=select on hand-written scored sets: filters, ties, strategies, pooling, pairs, bad input."""

from __future__ import annotations

import logging

import pytest
from datasets import Dataset, load_from_disk

from rsft.errors import ArtifactError, InputError
from rsft.paths import RunPaths
from rsft.store import atomic_artifact, read_meta
from rsft.run import run_stage


def row(prompt_id, sample_idx, completion, reward, finish_reason="eos", round_idx=0):
    return {"prompt_id": prompt_id, "prompt": f"prompt {prompt_id}", "sample_idx": sample_idx,
            "completion": completion, "finish_reason": finish_reason, "round": round_idx,
            "num_tokens": len(completion), "reward": float(reward), "reward_normalised": float(reward) / 2}


def write_scored(cfg, rows, round_idx=0, drop_column=None):
    ds = Dataset.from_list(rows)
    if drop_column:
        ds = ds.remove_columns(drop_column)
    with atomic_artifact(RunPaths(cfg.paths.run_dir).scored(round_idx), {"stage": "score"}) as tmp:
        ds.save_to_disk(str(tmp))


def selected_of(out):
    return load_from_disk(str(out)).to_list()


ROWS = [
    row("a", 0, "best but cut off", 9.0, finish_reason="length"),
    row("a", 1, "good", 5.0),
    row("a", 2, "good", 5.0),          # duplicate of sample 1
    row("a", 3, "   ", 8.0),           # empty
    row("a", 4, "worst", -1.0),
    row("b", 0, "tie one", 3.0),
    row("b", 1, "tie two", 3.0),
    row("b", 2, "low", 1.0),
]


def test_top1_filters_dedupes_and_breaks_ties_by_sample_index(make_cfg):
    cfg = make_cfg("stage=select")
    write_scored(cfg, ROWS)
    out = run_stage(cfg).path
    kept = {r["prompt_id"]: r for r in selected_of(out)}
    assert kept["a"]["completion"] == "good" and kept["a"]["sample_idx"] == 1
    assert kept["b"]["completion"] == "tie one"  # equal rewards: the lower sample index
    counts = read_meta(out)["counts"]
    assert counts["selected"] == 2 and counts["candidates"] == 8
    assert (counts["dropped_empty"], counts["dropped_truncated"], counts["dropped_duplicate"]) == (1, 1, 1)


def test_truncated_kept_when_configured_and_top_k(make_cfg):
    cfg = make_cfg("stage=select", "select.drop_truncated=false", "select.k=2", "select.prefer_complete=false")
    write_scored(cfg, ROWS)
    kept = selected_of(run_stage(cfg).path)
    assert [(r["prompt_id"], r["completion"], r["rank"]) for r in kept] == [
        ("a", "best but cut off", 0), ("a", "good", 1), ("b", "tie one", 0), ("b", "tie two", 1)]


def test_kept_truncated_completions_rank_after_complete_ones(make_cfg):
    rows = ROWS + [row("c", 0, "only a cut one", 2.0, finish_reason="length")]
    cfg = make_cfg("stage=select", "select.drop_truncated=false")  # prefer_complete=true by default
    write_scored(cfg, rows)
    out = run_stage(cfg).path
    kept = {r["prompt_id"]: r["completion"] for r in selected_of(out)}
    assert kept == {"a": "good", "b": "tie one", "c": "only a cut one"}  # c has nothing whole: the cut one
    counts = read_meta(out)["counts"]
    assert counts["selected_truncated"] == 1 and counts["prompts_kept"] == 3


def test_opening_cap_limits_the_share_of_kept_completions_sharing_an_opening(make_cfg):
    # ten prompts; every one's best completion opens "sorry as an ai i", its second-best differs
    rows = []
    for i in range(10):
        rows.append(row(f"p{i}", 0, f"Sorry, as an AI I cannot help with {i}", 5.0 + i))
        rows.append(row(f"p{i}", 1, f"Here is idea number {i} for you", 1.0))
    cfg = make_cfg("stage=select", "select.max_opening_share=0.2")
    write_scored(cfg, rows)
    out = run_stage(cfg).path
    kept = {r["prompt_id"]: r["completion"] for r in selected_of(out)}
    sorry = sorted(p for p, c in kept.items() if c.startswith("Sorry"))
    assert sorry == ["p8", "p9"]  # cap = 0.2 x 10 prompts = 2; the highest rewards claim it first
    assert len(kept) == 10 and all(c.startswith("Here") for p, c in kept.items() if p not in sorry)
    meta = read_meta(out)
    assert meta["counts"]["dropped_opening_cap"] == 8 and meta["stats"]["top_opening_share"] == pytest.approx(0.2)
    uncapped = make_cfg("stage=select", "run_name=uncapped")
    write_scored(uncapped, rows)
    assert read_meta(run_stage(uncapped).path)["stats"]["top_opening_share"] == 1.0


def test_opening_cap_must_be_a_fraction(make_cfg):
    cfg = make_cfg("stage=select", "select.max_opening_share=1.5")
    write_scored(cfg, ROWS)
    with pytest.raises(ValueError, match="select.max_opening_share=1.5"):
        run_stage(cfg)


def test_threshold_keeps_every_survivor_above_it(make_cfg):
    cfg = make_cfg("stage=select", "select.strategy=threshold", "select.threshold=1.0")  # normalised = reward/2
    write_scored(cfg, ROWS)
    assert sorted(r["completion"] for r in selected_of(run_stage(cfg).path)) == ["good", "tie one", "tie two"]


def test_random_baseline_same_budget_seeded(make_cfg):
    many = [row(p, i, f"{p} text {i}", float(i)) for p in "abcdef" for i in range(6)]
    picks = []
    for run_name, seed in (("r1", 0), ("r2", 0), ("r3", 1)):
        cfg = make_cfg("stage=select", "select.strategy=random", f"run_name={run_name}", f"seed={seed}")
        write_scored(cfg, many)
        picks.append([r["sample_idx"] for r in selected_of(run_stage(cfg).path)])
    assert len(picks[0]) == 6  # k=1 per prompt: the same budget as best-of-K
    assert picks[0] == picks[1] and picks[0] != picks[2]
    assert picks[0] != [5] * 6  # not the best each time


def test_pooling_ranks_earlier_rounds_too_and_ties_prefer_the_newer_round(make_cfg):
    cfg = make_cfg("stage=select", "round=1", "select.pool_rounds=-1")
    write_scored(cfg, [row("a", 0, "old best", 7.0), row("b", 0, "old tie", 2.0)], round_idx=0)
    write_scored(cfg, [row("a", 0, "new", 4.0, round_idx=1), row("b", 1, "new tie", 2.0, round_idx=1)], round_idx=1)
    kept = {r["prompt_id"]: r for r in selected_of(run_stage(cfg).path)}
    assert kept["a"]["completion"] == "old best" and kept["a"]["selected_in_round"] == 1
    assert kept["b"]["completion"] == "new tie"
    alone = make_cfg("stage=select", "round=1", "run_name=alone", "select.pairs=false", "select.pool_rounds=0")
    write_scored(alone, [row("a", 0, "new", 4.0, round_idx=1)], round_idx=1)
    assert [r["completion"] for r in selected_of(run_stage(alone).path)] == ["new"]


def test_pairs_are_best_vs_worst_in_trl_conversational_preference_format(make_cfg):
    cfg = make_cfg("stage=select", "data.system_prompt=Be brief.")
    write_scored(cfg, ROWS + [row("c", 0, "same", 1.0), row("c", 1, "also same", 1.0)])
    run_stage(cfg)
    pairs = {p["prompt_id"]: p for p in load_from_disk(str(RunPaths(cfg.paths.run_dir).pairs(0))).to_list()}
    assert set(pairs) == {"a", "b"}  # c's survivors tie: no preference to learn
    a = pairs["a"]
    assert a["prompt"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "prompt a"}]
    assert a["chosen"] == [{"role": "assistant", "content": "good"}]
    assert a["rejected"] == [{"role": "assistant", "content": "worst"}]
    assert a["chosen_reward"] > a["rejected_reward"]


def test_pooled_pairs_reject_the_pools_last_or_with_newest_round_a_mistake_of_the_newest_round(make_cfg):
    """select.rejected=pool: best against the pool's last in rank (an older round's cut ramble, here); newest_round:
    against the last in rank of the prompt's newest round (the policy's own mistake), and a prompt whose newest
    answers all tie with its best gives no pair; without pooling the two rules agree."""
    older = [row("a", 0, "old wrong", 0.0), row("a", 1, "older wrong", 0.0), row("a", 2, "right", 1.0),
             row("b", 0, "cut wrong", 0.0, finish_reason="length"), row("c", 0, "c wrong", 0.0)]
    newer = [row("a", 0, "new wrong", 0.0, round_idx=1), row("a", 1, "new wrong too", 0.0, round_idx=1),
             row("b", 0, "b right", 1.0, round_idx=1), row("b", 1, "b wrong", 0.0, round_idx=1),
             row("c", 0, "c right", 1.0, round_idx=1)]
    rejected = {}
    for rule in ("pool", "newest_round"):
        cfg = make_cfg("stage=select", "round=1", "select.pool_rounds=-1", "select.drop_truncated=false",
                       f"select.rejected={rule}", f"run_name={rule}")
        write_scored(cfg, older, round_idx=0)
        write_scored(cfg, newer, round_idx=1)
        run_stage(cfg)
        pairs = load_from_disk(str(RunPaths(cfg.paths.run_dir).pairs(1))).to_list()
        assert {p["prompt_id"]: p["chosen"][0]["content"] for p in pairs}["a"] == "right"  # the pool's best
        rejected[rule] = {p["prompt_id"]: p["rejected"][0]["content"] for p in pairs}
    assert rejected["pool"] == {"a": "older wrong", "b": "cut wrong", "c": "c wrong"}
    assert rejected["newest_round"] == {"a": "new wrong too", "b": "b wrong"}
    for rule in ("pool", "newest_round"):
        alone = make_cfg("stage=select", "round=1", f"run_name=alone-{rule}", "select.pool_rounds=0",
                         f"select.rejected={rule}")
        write_scored(alone, [row("a", 0, "right", 1.0, round_idx=1), row("a", 1, "wrong", 0.0, round_idx=1),
                             row("a", 2, "wrong too", 0.0, round_idx=1)], round_idx=1)
        run_stage(alone)
        alone_pairs = load_from_disk(str(RunPaths(alone.paths.run_dir).pairs(1))).to_list()
        assert [p["rejected"][0]["content"] for p in alone_pairs] == ["wrong too"]


def test_scored_set_without_reward_column_names_file_and_column(make_cfg):
    cfg = make_cfg("stage=select")
    write_scored(cfg, ROWS, drop_column="reward")
    with pytest.raises(ArtifactError, match=r"round_00/scored has no 'reward' column"):
        run_stage(cfg)


def test_one_sample_per_prompt_with_pairs_is_an_error(make_cfg):
    cfg = make_cfg("stage=select")
    write_scored(cfg, [row("a", 0, "only", 1.0), row("b", 0, "only", 1.0)])
    with pytest.raises(ValueError, match="select.pairs=false"):
        run_stage(cfg)
    cfg = make_cfg("stage=select", "select.pairs=false")
    assert len(selected_of(run_stage(cfg).path)) == 2


def test_prompt_with_every_completion_filtered_is_logged_and_skipped(make_cfg, caplog):
    cfg = make_cfg("stage=select")
    write_scored(cfg, ROWS + [row("z", 0, "", 1.0), row("z", 1, "cut", 2.0, finish_reason="length")])
    with caplog.at_level(logging.WARNING):
        out = run_stage(cfg).path
    assert "prompt z ('prompt z')" in caplog.text
    assert sorted(r["prompt_id"] for r in selected_of(out)) == ["a", "b"]
    assert read_meta(out)["prompts_without_survivors"] == ["z"]


def test_nothing_selected_stops_before_sft(make_cfg):
    cfg = make_cfg("stage=select")
    write_scored(cfg, [row("a", 0, "", 1.0), row("a", 1, "cut", 2.0, finish_reason="length")])
    with pytest.raises(ValueError, match="kept no completion"):
        run_stage(cfg)
    assert not (RunPaths(cfg.paths.run_dir).selected(0)).exists()


def test_no_pair_to_make_still_writes_a_loadable_empty_pairs_set(make_cfg):
    cfg = make_cfg("stage=select")
    write_scored(cfg, [row("a", 0, "one", 1.0), row("a", 1, "two", 1.0)])
    run_stage(cfg)
    assert len(load_from_disk(str(RunPaths(cfg.paths.run_dir).pairs(0)))) == 0


def test_a_cap_that_does_not_bind_changes_nothing_and_legacy_scores_pool(make_cfg):
    rows = [row(p, i, f"{p} answer {i}", float(i) + ord(p)) for p in "dcba" for i in range(3)]
    plain, capped = make_cfg("stage=select"), make_cfg("stage=select", "select.max_opening_share=1.0", "run_name=cap")
    for cfg in (plain, capped):
        write_scored(cfg, rows)
    assert selected_of(run_stage(plain).path) == selected_of(run_stage(capped).path)  # same rows, same order (SFT's data)
    # round 0 scored before the reward_model column existed, round 1 by the run's reward/: one model, pooled
    pooled = make_cfg("stage=select", "round=1", "run_name=pooled")
    write_scored(pooled, rows, round_idx=0)
    write_scored(pooled, [{**r, "round": 1, "reward": r["reward"] - 100, "reward_model": "reward"} for r in rows],
                 round_idx=1)
    out = run_stage(pooled).path
    assert {r["round"] for r in selected_of(out)} == {0} and read_meta(out)["counts"]["dropped_other_reward_model"] == 0


def test_a_threshold_above_every_survivor_is_named_as_the_cause(make_cfg):
    cfg = make_cfg("stage=select", "select.strategy=threshold", "select.threshold=50")
    write_scored(cfg, ROWS)
    with pytest.raises(ValueError, match=r"select\.threshold=50\.0 is above every surviving completion.*2\.500"):
        run_stage(cfg)


def test_dpo_pairs_that_no_margin_admits_stop_select_before_sft(make_cfg):
    cfg = make_cfg("stage=select", "loop.dpo=true", "dpo.min_margin=100")
    write_scored(cfg, ROWS)
    with pytest.raises(ValueError, match=r"reward gap >= dpo\.min_margin=100\.0.*lower dpo\.min_margin"):
        run_stage(cfg)
    assert run_stage(make_cfg("stage=select", "loop.dpo=true", "dpo.min_margin=0.5")).path


def test_truncated_penalty_ranks_cut_answers_by_reward_less_the_penalty(make_cfg):
    # reward_normalised = reward / 2: a's cut answer 4.5, its best whole one 2.5
    picks = {}
    for penalty in (1.0, 3.0):
        cfg = make_cfg("stage=select", "select.drop_truncated=false", f"select.truncated_penalty={penalty}",
                       f"run_name=penalty{penalty:g}")
        write_scored(cfg, ROWS)
        picks[penalty] = {r["prompt_id"]: r["completion"] for r in selected_of(run_stage(cfg).path)}
    assert picks[1.0]["a"] == "best but cut off"  # 4.5 - 1 = 3.5 > 2.5
    assert picks[3.0]["a"] == "good"              # 4.5 - 3 = 1.5 < 2.5
    bad = make_cfg("stage=select", "select.truncated_penalty=-1")
    write_scored(bad, ROWS)
    with pytest.raises(ValueError, match="select.truncated_penalty=-1"):
        run_stage(bad)


def test_random_baseline_draws_from_the_complete_answers_when_cut_ones_rank_after_them(make_cfg):
    rows = [row(p, i, f"{p} whole {i}", float(i)) for p in "abcdefgh" for i in range(2)]
    rows += [row(p, i, f"{p} cut {i}", 10.0 + i, finish_reason="length") for p in "abcdefgh" for i in range(2, 8)]
    rows += [row("z", i, f"z cut {i}", float(i), finish_reason="length") for i in range(4)]
    cfg = make_cfg("stage=select", "select.strategy=random", "select.drop_truncated=false")
    write_scored(cfg, rows)
    kept = {r["prompt_id"]: r["completion"] for r in selected_of(run_stage(cfg).path)}
    assert all("whole" in kept[p] for p in "abcdefgh")  # 6 of 8 are cut, yet the draw is among the whole ones
    assert "cut" in kept["z"]  # nothing whole: a cut one, as top_k would fall back to
    flat = make_cfg("stage=select", "select.strategy=random", "select.drop_truncated=false",
                    "select.prefer_complete=false", "run_name=flat")
    write_scored(flat, rows)
    assert any("cut" in r["completion"] for r in selected_of(run_stage(flat).path) if r["prompt_id"] != "z")


def test_diversity_gives_way_to_a_prompts_next_best_answer_when_its_best_repeats_the_kept_set(make_cfg):
    # every prompt's best answer is the same boilerplate; its second is its own, 0.5 (normalised) lower
    rows = []
    for i in range(6):
        rows.append(row(f"p{i}", 0, "i am sorry but i cannot help with that request", 4.0 + 0.1 * i))
        rows.append(row(f"p{i}", 1, f"topic {i} answer number {i} with words {i}", 3.0 + 0.1 * i))
    kept = {}
    for lam in (0.0, 0.4, 2.0):
        cfg = make_cfg("stage=select", f"select.diversity={lam}", f"run_name=div{lam:g}")
        write_scored(cfg, rows)
        out = run_stage(cfg).path
        kept[lam] = [r["sample_idx"] for r in selected_of(out)]
        assert [r["prompt_id"] for r in selected_of(out)] == [f"p{i}" for i in range(6)]  # output in prompt order
    assert kept[0.0] == [0] * 6
    assert kept[0.4] == [0] * 6  # the repeat costs 0.4 < the 0.5 gap: the best stays
    # lam 2: the highest-reward prompt (p5) keeps the boilerplate first; every later one repeats it and gives way
    assert kept[2.0] == [1, 1, 1, 1, 1, 0]


def test_diversity_leaves_the_random_baseline_alone_and_must_not_be_negative(make_cfg):
    many = [row(p, i, f"{p} text {i}", float(i)) for p in "abcdef" for i in range(6)]
    picks = []
    for lam in (0.0, 5.0):
        cfg = make_cfg("stage=select", "select.strategy=random", f"select.diversity={lam}", f"run_name=r{lam:g}")
        write_scored(cfg, many)
        picks.append([r["sample_idx"] for r in selected_of(run_stage(cfg).path)])
    assert picks[0] == picks[1]
    bad = make_cfg("stage=select", "select.diversity=-0.5")
    write_scored(bad, ROWS)
    with pytest.raises(ValueError, match="select.diversity=-0.5"):
        run_stage(bad)


def test_rarity_keeps_the_right_answer_fewest_candidates_gave_before_a_common_one(make_cfg):
    """select.rarity (issue 48): among equally rewarded survivors the text the prompt's candidates gave least often
    (case and spacing aside, every pooled round counted) ranks first; a better reward still wins, and without the
    lever the lower sample index does."""
    rounds = [[row("a", 0, "x = 4", 1.0), row("a", 1, "X =  4", 1.0), row("a", 2, "four, since 2 + 2", 1.0),
               row("a", 3, "x = 5", 0.0),
               row("b", 0, "common", 1.0), row("b", 1, "common", 1.0), row("b", 2, "rare but wrong", 0.0)],
              [row("a", 0, "x = 4", 1.0, round_idx=1), row("a", 1, "by counting: 4", 1.0, round_idx=1),
               row("a", 2, "four, since 2 + 2", 1.0, round_idx=1)]]
    kept = {}
    for name, extra in (("plain", []), ("rare", ["select.rarity=true"]), ("rare2", ["select.rarity=true", "select.k=2", "select.min_reward=0.5"])):
        cfg = make_cfg("stage=select", "round=1", f"run_name={name}", *extra)
        for r, rows in enumerate(rounds):
            write_scored(cfg, rows, round_idx=r)
        kept[name] = {}
        for r in selected_of(run_stage(cfg).path):
            kept[name].setdefault(r["prompt_id"], []).append(r["completion"])
    assert kept["plain"] == {"a": ["x = 4"], "b": ["common"]}  # the newer round, then the lower index
    # "x = 4" three times (case and spacing aside), "four, since 2 + 2" twice, "by counting: 4" once
    assert kept["rare"] == {"a": ["by counting: 4"], "b": ["common"]}
    # two kept, only right ones (reward_normalised is reward / 2 here): the rarest two of a, b's one right text
    assert kept["rare2"] == {"a": ["by counting: 4", "four, since 2 + 2"], "b": ["common"]}


def test_rarity_weight_gives_a_rare_right_answer_more_of_the_loss_and_each_prompt_an_average_of_one(make_cfg):
    """select.weight=rarity (issue 48): each kept row carries 1 / how many of the prompt's candidates gave its text
    (case and spacing aside, every pooled round counted), scaled to average 1 over the prompt's kept rows."""
    rounds = [[row("a", 0, "x = 4", 1.0), row("a", 1, "X =  4", 1.0), row("a", 2, "four, since 2 + 2", 1.0),
               row("a", 3, "x = 5", 0.0), row("b", 0, "common", 1.0), row("b", 1, "common", 1.0)],
              [row("a", 0, "x = 4", 1.0, round_idx=1), row("a", 1, "by counting: 4", 1.0, round_idx=1),
               row("a", 2, "four, since 2 + 2", 1.0, round_idx=1)]]
    cfg = make_cfg("stage=select", "round=1", "select.k=3", "select.min_reward=0.5", "select.weight=rarity")
    for r, rows in enumerate(rounds):
        write_scored(cfg, rows, round_idx=r)
    kept = {(r["prompt_id"], r["completion"]): r["weight"] for r in selected_of(run_stage(cfg).path)}
    inverse = {"x = 4": 1 / 3, "four, since 2 + 2": 1 / 2, "by counting: 4": 1.0}  # "X =  4" is "x = 4" twice more
    mean = sum(inverse.values()) / 3
    assert kept == pytest.approx({("a", text): w / mean for text, w in inverse.items()} | {("b", "common"): 1.0})
    plain = make_cfg("stage=select", "round=1", "select.k=3", "select.min_reward=0.5", "run_name=plain")
    for r, rows in enumerate(rounds):
        write_scored(plain, rows, round_idx=r)
    assert "weight" not in selected_of(run_stage(plain).path)[0]
    # select.weight_scale=prompt: the same shape within a prompt, summing to 1 over its kept rows
    per_prompt = make_cfg("stage=select", "round=1", "select.k=3", "select.min_reward=0.5", "select.weight=rarity",
                          "select.weight_scale=prompt", "run_name=per-prompt")
    for r, rows in enumerate(rounds):
        write_scored(per_prompt, rows, round_idx=r)
    kept = {(r["prompt_id"], r["completion"]): r["weight"] for r in selected_of(run_stage(per_prompt).path)}
    total = sum(inverse.values())
    assert kept == pytest.approx({("a", text): w / total for text, w in inverse.items()} | {("b", "common"): 1.0})


def test_difficulty_weight_is_the_share_of_the_rounds_samples_that_failed_scaled_to_average_one(make_cfg):
    """select.weight=difficulty (issue 48): a kept row weighs the share of its prompt's samples in the round it was
    drawn from that fall below select.min_reward (a prompt solved every time teaches nothing more, as GRPO's
    advantage is 0 there), the kept set's weights scaled to average 1; when every kept prompt was solved every time,
    every row weighs 1."""
    rounds = [[row("a", 0, "x = 4", 1.0), row("a", 1, "x = 5", 0.0), row("a", 2, "x = 6", 0.0), row("a", 3, "4", 1.0),
               row("b", 0, "right", 1.0), row("b", 1, "right too", 1.0)],
              [row("a", 0, "four", 1.0, round_idx=1), row("a", 1, "x = 4", 1.0, round_idx=1),
               row("a", 2, "x = 7", 0.0, round_idx=1), row("a", 3, "x = 4", 1.0, round_idx=1),
               row("c", 0, "hard", 1.0, round_idx=1), row("c", 1, "no", 0.0, round_idx=1),
               row("c", 2, "no", 0.0, round_idx=1), row("c", 3, "none", 0.0, round_idx=1)]]
    cfg = make_cfg("stage=select", "round=1", "select.k=2", "select.min_reward=0.5", "select.weight=difficulty")
    for r, rows in enumerate(rounds):
        write_scored(cfg, rows, round_idx=r)
    kept = {(r["prompt_id"], r["completion"], r["round"]): r["weight"] for r in selected_of(run_stage(cfg).path)}
    # a's round-1 answers failed 1 of 4 (0.25), a's round-0 ones 2 of 4 (0.5); b solved 2 of 2 (0); c failed 3 of 4
    raw = {("a", "four", 1): 0.25, ("a", "x = 4", 1): 0.25, ("b", "right", 0): 0.0, ("b", "right too", 0): 0.0,
           ("c", "hard", 1): 0.75}
    mean = sum(raw.values()) / len(raw)
    assert kept == pytest.approx({key: w / mean for key, w in raw.items()})
    solved = make_cfg("stage=select", "select.min_reward=0.5", "select.weight=difficulty", "run_name=solved")
    write_scored(solved, [row("b", 0, "right", 1.0), row("b", 1, "right too", 1.0)])
    assert [r["weight"] for r in selected_of(run_stage(solved).path)] == [1.0]


@pytest.mark.parametrize("extra,expected", [([], "min_reward=None"),
                                            (["select.min_reward=0.5", "select.strategy=random"], "strategy=random")])
def test_difficulty_weight_without_a_pass_or_with_the_random_baseline_is_refused(make_cfg, extra, expected):
    from rsft.preflight import check_config
    from rsft.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"select\.weight='difficulty': expected .*{expected}"):
        check_config(make_cfg("stage=select", "select.weight=difficulty", *extra))


def test_advantage_keeps_right_and_wrong_answers_weighted_by_their_reward_less_the_prompts_mean(make_cfg):
    """select.strategy=advantage (issue 48, learning from mistakes): every survivor whose reward differs from its
    prompt's mean in its round is kept, weighted by (reward - mean) / samples, a text's copies summed (dedupe) or each
    its own (dedupe=false); a prompt whose answers all tie gives nothing; one scale makes the positive weights sum to
    the prompts kept, so each prompt's weights sum to 0. select.min_reward does not filter the wrong answers out."""
    rows = [row("a", 0, "4", 1.0), row("a", 1, "4", 1.0), row("a", 2, "5", 0.0), row("a", 3, "6", 0.0),
            row("b", 0, "right", 1.0), row("b", 1, "right too", 1.0),  # solved every time: nothing to learn
            row("c", 0, "hard", 1.0), row("c", 1, "no", 0.0), row("c", 2, "no", 0.0), row("c", 3, "none", 0.0)]
    kept = {}
    for name, extra in (("merged", []), ("copies", ["select.dedupe=false"])):
        cfg = make_cfg("stage=select", "select.strategy=advantage", "select.min_reward=1.0", f"run_name={name}", *extra)
        write_scored(cfg, rows)
        kept[name] = [(r["prompt_id"], r["completion"], r["weight"]) for r in selected_of(run_stage(cfg).path)]
    # a: mean 1/2 of 4, so a right copy 1/8 and a wrong one -1/8; c: mean 1/4, right 3/16, wrong -1/16 a copy
    raw = [("a", "4", 2 / 8), ("a", "5", -1 / 8), ("a", "6", -1 / 8), ("c", "hard", 3 / 16), ("c", "no", -2 / 16),
           ("c", "none", -1 / 16)]
    scale = 2 / (2 / 8 + 3 / 16)
    assert [(p, t) for p, t, _ in kept["merged"]] == [(p, t) for p, t, _ in raw]
    assert [w for _, _, w in kept["merged"]] == pytest.approx([w * scale for _, _, w in raw])
    for prompt in "ac":
        assert sum(w for p, _, w in kept["merged"] if p == prompt) == pytest.approx(0.0, abs=1e-9)
    assert sum(w for _, _, w in kept["merged"] if w > 0) == pytest.approx(2.0)
    copies = [("a", "4", 1 / 8), ("a", "4", 1 / 8), ("a", "5", -1 / 8), ("a", "6", -1 / 8), ("c", "hard", 3 / 16),
              ("c", "no", -1 / 16), ("c", "no", -1 / 16), ("c", "none", -1 / 16)]
    assert [(p, t) for p, t, _ in kept["copies"]] == [(p, t) for p, t, _ in copies]
    assert [w for _, _, w in kept["copies"]] == pytest.approx([w * scale for _, _, w in copies])


def test_advantage_with_every_answer_tied_or_online_replay_or_with_a_cap_is_refused(make_cfg):
    """select.strategy=advantage: nothing to push when every prompt's answers tie (a clear error, not an empty SFT);
    stage=online with replay (stale weights) or with steps on part of a mini-batch, and a weight, an opening cap or a
    diversity pick, would break a prompt's balance: each refused before any work."""
    from rsft.preflight import check_config
    from rsft.errors import ConfigError

    tied = make_cfg("stage=select", "select.strategy=advantage")
    write_scored(tied, [row("a", 0, "x", 1.0), row("a", 1, "y", 1.0), row("b", 0, "z", 0.0)])
    with pytest.raises(InputError, match="ties with its prompt's others"):
        run_stage(tied)
    online = ("stage=online", "select.strategy=advantage", "online.prompts_per_batch=2", "sample.num_samples=3")
    check_config(make_cfg(*online, "online.batch_size=6"))  # a step holds the whole mini-batch: accepted
    with pytest.raises(ConfigError, match=r"online.replay=2 with select.strategy=advantage.*set online.replay=0"):
        check_config(make_cfg(*online, "online.batch_size=6", "online.replay=2"))
    with pytest.raises(ConfigError, match=r"online.batch_size=4 with select.strategy=advantage.*at least .* = 6"):
        check_config(make_cfg(*online, "online.batch_size=4"))
    for extra in ("select.weight=rarity", "select.max_opening_share=0.5", "select.diversity=0.5"):
        with pytest.raises(ConfigError, match=rf"select\.{extra.split('=')[0][7:]}=.*with strategy=advantage"):
            check_config(make_cfg("stage=select", "select.strategy=advantage", extra))


@pytest.mark.parametrize("extra", [["select.k=1"], ["select.strategy=random", "select.k=2"]])
def test_rarity_weight_without_several_kept_rows_per_prompt_is_refused(make_cfg, extra):
    from rsft.preflight import check_config
    from rsft.errors import ConfigError

    with pytest.raises(ConfigError, match=r"select\.weight='rarity': expected none with strategy="):
        check_config(make_cfg("stage=select", "select.weight=rarity", *extra))
    check_config(make_cfg("stage=online", "select.weight=rarity", "select.k=2"))  # online weighs its steps alike
    with pytest.raises(ConfigError, match=r"select\.weight_scale='prompt': expected row with weight=none"):
        check_config(make_cfg("stage=select", "select.weight_scale=prompt", "select.k=2"))


def test_advantage_scaled_by_std_divides_each_prompts_differences_by_its_rewards_spread(make_cfg):
    """select.advantage_scale=std (GRPO's scale_rewards=group): each prompt's (reward - mean) / samples is also divided
    by the standard deviation (Bessel's) of its round's rewards, before the one scale; a prompt's weights still sum to
    0. The setting is refused with any other strategy."""
    import math

    from rsft.errors import ConfigError
    from rsft.preflight import check_config

    rows = [row("a", 0, "4", 1.0), row("a", 1, "4", 1.0), row("a", 2, "5", 0.0), row("a", 3, "6", 0.0),
            row("c", 0, "hard", 1.0), row("c", 1, "no", 0.0), row("c", 2, "no", 0.0), row("c", 3, "none", 0.0)]
    cfg = make_cfg("stage=select", "select.strategy=advantage", "select.advantage_scale=std")
    write_scored(cfg, rows)
    kept = [(r["prompt_id"], r["completion"], r["weight"]) for r in selected_of(run_stage(cfg).path)]
    std_a, std_c = math.sqrt(1 / 3), 0.5  # a: 1, 1, 0, 0 about 1/2; c: 1, 0, 0, 0 about 1/4
    raw = [("a", "4", 2 / 8 / std_a), ("a", "5", -1 / 8 / std_a), ("a", "6", -1 / 8 / std_a),
           ("c", "hard", 3 / 16 / std_c), ("c", "no", -2 / 16 / std_c), ("c", "none", -1 / 16 / std_c)]
    scale = 2 / (2 / 8 / std_a + 3 / 16 / std_c)
    assert [(p, t) for p, t, _ in kept] == [(p, t) for p, t, _ in raw]
    assert [w for _, _, w in kept] == pytest.approx([w * scale for _, _, w in raw])
    for prompt in "ac":
        assert sum(w for p, _, w in kept if p == prompt) == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ConfigError, match=r"select\.advantage_scale='std': expected none with strategy=top_k"):
        check_config(make_cfg("stage=select", "select.advantage_scale=std"))


@pytest.mark.parametrize("positive", [0.1, 0.5])
def test_advantage_positive_cuts_the_push_up_and_leaves_the_push_down(make_cfg, positive):
    """select.advantage_positive (W-REINFORCE's lambda): after the one scale, the weights above a prompt's mean are
    multiplied by it and the ones below are as without it, so the push down outweighs the push up. Refused at 0 (SFT
    would have no positive weight), or with any other strategy; left out of the fingerprints at 1."""
    from rsft.errors import ConfigError
    from rsft.preflight import check_config
    from rsft.stages import WHILE_OFF

    rows = [row("a", 0, "4", 1.0), row("a", 1, "4", 1.0), row("a", 2, "5", 0.0), row("a", 3, "6", 0.0),
            row("c", 0, "hard", 1.0), row("c", 1, "no", 0.0), row("c", 2, "no", 0.0), row("c", 3, "none", 0.0)]
    weights = {}
    for name, extra in (("plain", []), ("cut", [f"select.advantage_positive={positive}"])):
        cfg = make_cfg("stage=select", "select.strategy=advantage", f"run_name={name}", *extra)
        write_scored(cfg, rows)
        weights[name] = [(r["prompt_id"], r["completion"], r["weight"]) for r in selected_of(run_stage(cfg).path)]
    assert [(p, t) for p, t, _ in weights["cut"]] == [(p, t) for p, t, _ in weights["plain"]]
    expected = [w * positive if w > 0 else w for _, _, w in weights["plain"]]
    assert [w for _, _, w in weights["cut"]] == pytest.approx(expected)
    assert sum(w for _, _, w in weights["cut"] if w > 0) == pytest.approx(2.0 * positive)  # two prompts kept
    assert sum(w for _, _, w in weights["cut"] if w < 0) == pytest.approx(-2.0)
    with pytest.raises(ConfigError, match=r"select\.advantage_positive=0\.5: expected 1 with strategy=top_k"):
        check_config(make_cfg("stage=select", "select.advantage_positive=0.5"))
    for bad in ("-0.1", "0.0"):
        with pytest.raises(ConfigError, match=rf"select\.advantage_positive={bad}: expected a number > 0 \(0 would"):
            check_config(make_cfg("stage=select", "select.strategy=advantage", f"select.advantage_positive={bad}"))
    assert WHILE_OFF["select.advantage_positive"](make_cfg("stage=select"))
