"""sample: how completions are drawn (the sampler, pruning, adaptive and automatic K, vLLM).
"""

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from rsft.config.rules import (
    Check,
    Checked,
    _fail,
    _integer,
    _number,
    _sampling_rule,
    _typed,
    _unresolved,
    at_least,
    boolean,
    number,
    one_of,
    optional,
    sampling_rule,
    setting,
    typed,
)
from rsft.sampling.budget import check_checkpoints, check_checkpoints_below, check_prune_share, check_prune_stops
from rsft.sampling.processing import check_temperature, check_top_k, check_top_p
from rsft.sampling.verifier import STRATEGIES, check_leniency, check_strategy_name


# The sampling settings' own checks, sample's and prefs' (which interpolates sample's): the YAML's types
# here, the ranges rsft.sampling's rules (messages naming the key inside the group).
MAX_NEW_TOKENS = at_least(1)
# Above MAX_TEMPERATURE every next-token distribution is flat to within a few percent (logits a few tens apart
# become < 1 apart): the samples are noise, so a larger value is a typo (1e300, 700 for 0.7), not a setting.
MAX_TEMPERATURE = 100.0


def _temperature(key: str, value) -> None:
    expected = f"a number > 0 and <= {MAX_TEMPERATURE:g} (above it sampling is near-uniform noise)"
    _typed(key, value, float, expected)
    if not _unresolved(value) and value > MAX_TEMPERATURE:
        _fail(key, value, expected)


# > 0 unless strategy=greedy: a rule across settings (_check_sampling); the upper bound is the setting's own
TEMPERATURE = Check(_temperature, f"<= {MAX_TEMPERATURE:g}")
TOP_K = sampling_rule(check_top_k, ">= 0", int, "an integer >= 0 (0 = off)")
TOP_P = sampling_rule(check_top_p, "in (0, 1]", float, "a number in (0, 1]")
STRATEGY = sampling_rule(check_strategy_name, "one of " + ", ".join(STRATEGIES))
LENIENCY = typed(float, "a number in (0, 1]")  # its range depends on the strategy (_check_sampling)
BATCH_ROWS = at_least(1)


def _check_sampling(sampling) -> None:
    """The sampling rules across settings (rsft.sampling's), for sample and prefs."""
    # temperature is unused by strategy=greedy (the argmax), and must be > 0 for every other strategy
    _sampling_rule(check_temperature, sampling.temperature, sampling.strategy)
    # leniency belongs to strategy=lenient: in (0, 1] there, 1.0 with any other strategy
    _sampling_rule(check_leniency, sampling.leniency, sampling.strategy)


def _checkpoints(key: str, points) -> None:
    """prune.at: each an int (the YAML's type), then rsft.sampling.budget's rule (ascending, distinct, >= 1)."""
    if any(_unresolved(point) for point in points):
        return
    for i, point in enumerate(points):
        _typed(f"{key}[{i}]", point, int, "an integer >= 1")
    check_checkpoints(points, key)


@dataclass
class PruneConfig(Checked):
    """Stop the completions nobody will keep (rsft.sampling.budget: the rule and its bias)."""

    at: List[int] = setting([], "Checkpoints in tokens, ascending, each below max_new_tokens, where each prompt's "
                                "rows are ranked by the reward model; [] = off.",
                            check=Check(_checkpoints, "ascending, each >= 1"))
    share: float = setting(0.5, "Fraction of a prompt's rows stopped at each checkpoint, in (0, 1), at least 1 / "
                                "the rows a prompt has (a smaller share stops none); at=[] turns pruning off.",
                           check=sampling_rule(check_prune_share, "in (0, 1)", float, "a fraction in (0, 1)"))
    rank_finished: bool = setting(True, "true: answers finished by a checkpoint compete with the live prefixes; false: "
                                        "live prefixes rank among themselves only.", check=boolean())


@dataclass
class AdaptiveKConfig(Checked):
    """Adaptive K: a first pass of k0 per prompt, the rest of a mean per prompt where another sample can change
    the pick (rsft.sampling.budget.allocate)."""

    k0: int = setting(0, "Completions per prompt in the first pass, below num_samples; 0 = off (every prompt gets "
                         "num_samples).", check=at_least(0, "(0 = off)"))
    mean: Optional[float] = setting(None, "Mean completions per prompt over both passes, above k0 and below "
                                          "num_samples (no prompt gets more than num_samples); set with k0, null "
                                          "while k0=0.")

    def __post_init__(self):
        super().__post_init__()
        if self.mean is None or _unresolved(self.mean) or _unresolved(self.k0):
            return  # a k0 without a mean is refused with num_samples in view (SampleConfig)
        # k0=0 is off: a mean alone would change nothing, silently
        if self.k0 == 0:
            _fail(self._AT + "mean", self.mean, "null while adaptive_k.k0=0 (adaptive K off); set adaptive_k.k0 "
                                                "(e.g. 4) to turn it on")
        # a mean over both passes counts the first pass's k0 per prompt: at k0 the second pass draws nothing,
        # and the first pass would be scored for nothing
        _number(self._AT + "mean", self.mean, f"a mean completions per prompt above k0={self.k0} (at k0 the second "
                                              f"pass draws nothing, yet the first is scored), or adaptive_k.k0=0 "
                                              f"to turn adaptive K off", lambda v: v > self.k0)


@dataclass
class VllmConfig(Checked):
    """The vLLM engine behind sample.backend=vllm (docs/vllm.md)."""

    dtype: Optional[str] = setting(None, "The engine's dtype (auto, float32, bfloat16, float16); null = policy.dtype "
                                         "(float32 unless set).",
                                   check=optional(one_of(("auto", "float32", "bfloat16", "float16"))))
    tensor_parallel_size: int = setting(1, "GPUs one engine shards the policy over (vLLM starts its own workers; "
                                           "1 under a launcher, where each process is one engine).", check=at_least(1))
    gpu_memory_utilization: float = setting(0.5, "Share of a GPU's memory the engine may take, in (0, 1].",
                                            check=number("a fraction in (0, 1]", lambda v: 0 < v <= 1, "in (0, 1]"))
    max_model_len: Optional[int] = setting(None, "The engine's context; null = the model's.",
                                           check=optional(at_least(1, "(or null)")))
    engine_args: Dict[str, Any] = setting({}, "More vllm.LLM arguments as they are, e.g. {enforce_eager: true, "
                                              "speculative_config: {...}}.")


SAMPLING_BACKENDS = ("rsft", "vllm")
CUDA_GRAPHS = ("auto", "eager", "off")  # rsft.sampling.graphed.MODES


@dataclass
class AutoKConfig(Checked):
    """sample.num_samples=auto (rsft.auto_k): round 0 samples `start`; round r samples the smallest N at which
    round r - 1's best-of-N curve stopped rising by the truth (its evaluation's best_of_n.enough: the judge,
    else gold), within [floor, cap]; a curve still rising at its last N doubles K instead."""

    cap: int = setting(8, "The most completions per prompt a round samples.", check=at_least(2))
    # why 3: docs/when-to-stop.md measures the floors against K=8
    floor: int = setting(3, "The fewest completions per prompt a round samples.", check=at_least(1))
    start: Optional[int] = setting(None, "Round 0's K, before any curve exists (null = cap).",
                                   check=optional(at_least(1)))

    def __post_init__(self):
        super().__post_init__()
        if not any(_unresolved(v) for v in (self.cap, self.floor, self.start)):
            if self.floor > self.cap:
                _fail(self._AT + "floor", self.floor, f"at most auto_k.cap={self.cap}")
            if self.start is not None and not self.floor <= self.start <= self.cap:
                _fail(self._AT + "start", self.start, f"between auto_k.floor={self.floor} and auto_k.cap={self.cap}")


def k_schedule(value) -> list[int] | None:
    """sample.num_samples as a list of K per round (round r samples the r-th, the last repeating), else None."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or not hasattr(value, "__iter__"):
        return None
    return list(value)


def _num_samples(key: str, value) -> None:
    """An integer >= 1, auto, or a non-empty list of integers >= 1 (a fixed K per round)."""
    if value == "auto":
        return
    schedule = k_schedule(value)
    if schedule is None:
        return _integer(key, value, 1, "or auto, or a list of K per round ([8, 4, 3])")
    if not schedule:
        _fail(key, value, "a non-empty list of K per round ([8, 4, 3]), an integer >= 1, or auto")
    for index, k in enumerate(schedule):
        _integer(f"{key}[{index}]", k, 1, "(round " + str(index) + "'s K)")


def samples_per_prompt(sample) -> int:
    """sample.num_samples where it is a number: `auto` is resolved to the round's K (rsft.auto_k) before a stage
    samples, so a sampler that meets it unresolved is a bug, not a user's mistake."""
    k = sample.num_samples
    if isinstance(k, bool) or not isinstance(k, int):
        raise RuntimeError(f"sample.num_samples={k!r} reached the sampler unresolved (rsft.auto_k resolves auto)")
    return k


def k_range(sample) -> tuple[int, int]:
    """The fewest and the most completions per prompt a round can sample: num_samples, with auto the floor and the
    cap, with a schedule its smallest and largest K."""
    schedule = k_schedule(sample.num_samples)
    if schedule is not None:
        return min(int(k) for k in schedule), max(int(k) for k in schedule)
    if sample.num_samples == "auto":
        return int(sample.auto_k.floor), int(sample.auto_k.cap)
    return int(sample.num_samples), int(sample.num_samples)


def most_samples(sample) -> int:
    return k_range(sample)[1]


def fewest_samples(sample) -> int:
    return k_range(sample)[0]


@dataclass
class SampleConfig(Checked):
    num_samples: Any = setting(8, "K: completions sampled per prompt; auto: each round samples the K the previous "
                                  "round's best-of-N curve says is enough (sample.auto_k); a list ([8, 4, 3]): round r "
                                  "samples its r-th K, the last repeating.", shown_type="int, auto or list of int",
                               check=Check(_num_samples, ">= 1"))
    auto_k: AutoKConfig = setting(AutoKConfig, "With num_samples=auto: how K is chosen each round.")
    max_new_tokens: int = setting(48, "Tokens per completion at most; a longer one is cut (finish_reason length).",
                                  check=MAX_NEW_TOKENS)
    # below plain sampling's temperature, at which the default policy rambles
    # (docs/history.md#why-each-default-setting)
    temperature: float = setting(0.7, "Sampling temperature, in [1e-6, 100] (strategy=greedy ignores it).",
                                  check=TEMPERATURE)
    top_k: int = setting(0, "Keep the k most probable tokens; 0 = off.", check=TOP_K)
    top_p: float = setting(1.0, "Nucleus sampling mass, in (0, 1]: the most probable tokens whose mass reaches it, "
                                "and any tied with the last of them; 1.0 = off.", check=TOP_P)
    strategy: str = setting("exact", "exact | greedy | lenient (lossy) | skip_adjustment (lossy): how drafts are "
                                     "verified.", check=STRATEGY)
    leniency: float = setting(1.0, "Only for strategy=lenient, in (0, 1]; 1.0 otherwise.", check=LENIENCY)
    batch_rows: int = setting(64, "Rows decoded together; finished rows leave, waiting ones join.", check=BATCH_ROWS)
    cuda_graphs: str = setting("auto", "auto: on CUDA each sampling step is a replayed CUDA graph, every cache row at a "
                                       "fixed shape (rsft.sampling.graphed) | eager (that step uncaptured, any "
                                       "device) | off (the packed step).", check=one_of(CUDA_GRAPHS))
    shard_prompts: int = setting(256, "Sampling stages (sample, prefs, eval) save each finished shard of this many "
                                      "prompts; a rerun after a kill samples only the rest (0 = one shard).",
                                 check=at_least(0, "(0 = one shard)"))
    backend: str = setting("rsft", "rsft (its own exact sampler and drafts) | vllm (a vLLM engine; every sampling "
                                   "stage: prefs, sample, eval).", check=one_of(SAMPLING_BACKENDS))
    vllm: VllmConfig = setting(VllmConfig, "The vLLM engine, for backend=vllm.")
    prune: PruneConfig = setting(PruneConfig, "stage=sample only: stop low-ranked rows at checkpoints.")
    adaptive_k: AdaptiveKConfig = setting(AdaptiveKConfig, "stage=sample only: adaptive K per prompt.")

    def __post_init__(self):
        super().__post_init__()
        _check_sampling(self)
        # a checkpoint at or past max_new_tokens would rank rows that have all finished
        _sampling_rule(check_checkpoints_below, self.prune.at, self.max_new_tokens, "")
        # pruning stops rows between decoding steps, which only rsft's own sampler lets it do
        if self.backend == "vllm" and self.prune.at:
            _fail("prune.at", list(self.prune.at), "[] with backend=vllm (pruning needs rsft's sampler, which controls "
                                                   "every row between steps)")
        self._check_budget()

    def _check_budget(self) -> None:
        """Adaptive K and pruning, against num_samples: each must be able to change what is sampled, since
        either scores rows with the reward model (rsft.sampling.budget)."""
        k0, mean = self.adaptive_k.k0, self.adaptive_k.mean
        if any(_unresolved(v) for v in (self.num_samples, self.auto_k.cap, k0, mean, self.prune.share)):
            return
        n = most_samples(self)
        adaptive = k0 > 0
        if self.num_samples == "auto":
            # auto chooses each round's mean completions per prompt (rsft.auto_k.resolved): with adaptive K it is
            # adaptive_k.mean, each prompt still getting at most the cap; pruning must stop a row at the floor
            if adaptive and mean is not None:
                _fail("adaptive_k.mean", mean, "null with num_samples=auto, which sets each round's mean completions "
                                               "per prompt from the previous round's best-of-N curve")
            if adaptive and k0 >= self.auto_k.floor:
                _fail("adaptive_k.k0", k0, f"below sample.auto_k.floor={self.auto_k.floor} with num_samples=auto (a "
                                           f"first pass of k0 must leave a round of the floor something to allocate)")
            if self.prune.at:
                floor = int(self.auto_k.floor)
                rows, rows_from = (floor, f"auto_k.floor={floor}") if not adaptive else (
                    max(k0, n - k0), f"the larger of adaptive K's passes: k0={k0}, cap - k0={n - k0}")
                _sampling_rule(check_prune_stops, list(self.prune.at), self.prune.share, self.prune.rank_finished,
                               rows, rows_from, "")
            return
        # a schedule is checked at each of its K, each being some round's num_samples
        for n in sorted({int(k) for k in k_schedule(self.num_samples) or [n]}):
            self._check_budget_at(n, k0, mean, adaptive)

    def _check_budget_at(self, n: int, k0: int, mean, adaptive: bool) -> None:
        # num_samples is the most completions one prompt gets: a first pass of all of them leaves nothing to give
        if adaptive and k0 >= n:
            _fail("adaptive_k.k0", k0, f"an integer below num_samples={n} (a first pass of every completion "
                                       f"leaves adaptive K nothing to allocate, yet is scored), or 0 (off)")
        # the mean over both passes: at num_samples every prompt gets num_samples, as without adaptive K;
        # above it, more than any prompt may get
        if adaptive and (mean is None or mean >= n):
            why = ("no prompt gets more than num_samples" if mean is not None and mean > n else
                   "at num_samples every prompt gets num_samples, as with adaptive_k.k0=0, after scoring the first "
                   "pass for nothing")
            _fail("adaptive_k.mean", mean, f"a mean completions per prompt above k0={k0} and below num_samples={n} "
                                           f"with adaptive_k.k0={k0} (e.g. {(k0 + n) / 2:g}); {why}")
        # pruning ranks one pass's rows of a prompt at a time (adaptive K: the first pass's k0, then the
        # second's, at most num_samples - k0): a share that stops none of them only pays for the scoring
        if self.prune.at:
            rows, rows_from = (n, f"num_samples={n}") if not adaptive else (
                max(k0, n - k0), f"the larger of adaptive K's passes: k0={k0}, num_samples - k0={n - k0}")
            _sampling_rule(check_prune_stops, list(self.prune.at), self.prune.share, self.prune.rank_finished, rows,
                           rows_from, "")
