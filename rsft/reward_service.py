"""Scoring, the service below score, eval, sample (pruning and adaptive K) and the scripts: the configured
reward source (reward_source: reward.sources), which trained reward model folder a round reads, the
judge (eval.judge) and its independence, and scoring rows in resumable shards."""

from __future__ import annotations

import json
import logging
import statistics
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rsft import distributed
from rsft.errors import ConfigError, MissingInput
from rsft.config import uses_trained_reward  # noqa: F401  (scripts read it here, beside open_reward)
from rsft.paths import RunPaths
from reward.sources import RewardSource, TrainedReward, combine, local_imports
from reward.specs import open_source
from rsft.store import ShardStore, is_complete, loading_artifact, read_meta

log = logging.getLogger(__name__)


def reward_model(cfg: DictConfig, round_idx: int | None = None):
    """The reward model folder that scores round r (RunPaths.scoring_reward), or with round_idx=None
    the run's reward/, which stage=eval uses for every policy (score and eval check it before
    any work); a clear error when missing."""
    paths = RunPaths.from_config(cfg)
    path = paths.eval_reward if round_idx is None else paths.scoring_reward(round_idx)
    if not is_complete(path):
        if path != paths.reward:
            raise MissingInput(
                f"no refreshed reward model at {path} (loop.refresh_reward=true): stage=refresh builds it from round "
                f"{round_idx}'s samples; run `python -m rsft.run stage=refresh round={round_idx} "
                f"loop.refresh_reward=true` first")
        raise MissingInput(
            f"no trained reward model at {path}: stage=reward builds it from the labels stage=prefs writes; run "
            f"`python -m rsft.run stage=prefs run_name={cfg.run_name}` then `... stage=reward` (stage=loop does both)"
        )
    return path


def trained_reward(path: Path, device) -> RewardSource:
    """A trained reward model folder (stage=reward, stage=refresh) as a reward source, checked first."""
    with loading_artifact(path):
        return TrainedReward(path, device)


_OPENED: dict[tuple, RewardSource] = {}  # each configured source is opened once per process (plan and build)


def _stamp(spec: str) -> tuple:
    """What a spec's local files look like now (size and mtime), so an edited file is opened again: a
    function file's with the local modules it imports (reward.sources.local_imports)."""
    body = spec.split(":", 1)[1] if spec.startswith(("pretrained:", "function:", "trained:")) else spec
    for candidate in (body, body.rpartition(":")[0]):
        path = Path(candidate).expanduser() if candidate else None
        if path is not None and path.exists():
            files = [path, *local_imports(path)] if path.is_file() else sorted(f for f in path.rglob("*")
                                                                                if f.is_file())
            return tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.is_file())
    return ()


def _opened(spec: str, device, **options) -> RewardSource:
    key = (spec, str(device), tuple(sorted(options.items())), _stamp(spec))
    if key not in _OPENED:
        _OPENED[key] = open_source(spec, device, **options)
    return _OPENED[key]


def _part(cfg: DictConfig, spec: str, device, trained_folder: Path | None) -> RewardSource:
    if spec == "trained":
        if trained_folder is None:
            raise RuntimeError("a trained reward component needs its folder")  # the callers pass it: a bug
        return trained_reward(trained_folder, device)
    rs = source_config(cfg)
    options = {"head": rs.head, "max_length": rs.max_length} if spec.startswith("pretrained:") or Path(
        spec).is_dir() else {}
    if spec.startswith(("http://", "https://")):
        options = {"model": rs.model, "revision": rs.revision, "timeout": float(rs.timeout),
                   "retries": int(rs.retries), "batch_size": int(rs.batch_size)}
    return _opened(spec, device, **{k: v for k, v in options.items() if v is not None})


def source_spec(cfg: DictConfig) -> str:
    """reward_source as one spec string (reward.specs.open_source): kind:spec, a URL as it is."""
    rs = source_config(cfg)
    return str(rs.spec) if rs.kind == "http" else f"{rs.kind}:{rs.spec}"


def open_reward(cfg: DictConfig, device, trained_folder: Path | None = None) -> RewardSource:
    """The configured reward source; its trained parts are the model at `trained_folder` (the round's
    scorer, RunPaths.scoring_reward; eval's, RunPaths.eval_reward)."""
    rs = source_config(cfg)
    if rs.kind == "trained":
        return _part(cfg, "trained", device, trained_folder)
    if rs.kind != "combination":
        return _part(cfg, source_spec(cfg), device, trained_folder)
    parts = {}
    for name, component in rs.components.items():
        if "source" not in component:
            raise ConfigError(f"reward_source.components.{name}: expected {{source: ..., weight: ...}}, got "
                              f"{dict(component)}")
        parts[str(name)] = (_part(cfg, str(component["source"]), device, trained_folder),
                            float(component.get("weight", 1.0)))
    return combine(parts, str(rs.combine))


def combination_parts(scorer: RewardSource) -> dict[str, RewardSource]:
    """A combination's components by name (stage=score keeps each one's raw score as a column); {} otherwise."""
    return {name: source for name, (source, _) in getattr(scorer, "parts", {}).items()}


def source_config(cfg: DictConfig):
    """reward_source, or the trained model for a config recorded before reward sources existed (replay_budget
    reads a run's recorded config)."""
    return cfg.get("reward_source") or OmegaConf.create({"kind": "trained", "spec": None, "components": {}})


def source_identity(cfg: DictConfig, device) -> dict:
    """What the configured reward's parts other than the trained model are (reward.sources identity:
    file digests, a function's source, a server's model and revision), for fingerprints; {} for the trained
    model alone, whose folder is an input artifact."""
    rs = source_config(cfg)
    if rs.kind == "trained":
        return {}
    if rs.kind != "combination":
        return {"reward_source": _part(cfg, source_spec(cfg), device, None).identity()}
    return {f"reward_source.{name}": {"weight": float(c.get("weight", 1.0)),
                                      **_part(cfg, str(c["source"]), device, None).identity()}
            for name, c in rs.components.items() if str(c.get("source")) != "trained"} | {
        "reward_source.combine": {"mode": str(rs.combine)}}


def judge_model(cfg: DictConfig) -> Path | None:
    """eval.judge as a reward-model folder, or None when unset.

    eval.judge names a folder that stage=reward wrote (e.g. runs/<other>/reward) or a run name whose
    reward/ is the judge. Refused: a path or run that holds no complete reward model. Why it may not be
    independent of the proxy is judge_warnings' (stage=eval logs them and records them in its metrics).
    """
    name = cfg.eval.get("judge")
    if name is None or judge_spec(cfg) is not None:
        return None
    paths = RunPaths.from_config(cfg)
    folder = Path(str(name)).expanduser()
    if not folder.is_dir():
        from rsft.config import check_run_name

        try:
            check_run_name(str(name), "eval.judge")
        except ConfigError:
            raise MissingInput(f"eval.judge={name!r}: no such folder, and not a run name; expected a folder "
                                    f"written by stage=reward (e.g. runs/<run>/reward) or a run name") from None
        folder = paths.other_run(str(name)).reward
        if not folder.is_dir():
            raise MissingInput(f"eval.judge={name!r}: neither a folder nor a run with a reward model "
                                    f"({folder} is missing); train it with `python -m rsft.run stage=reward "
                                    f"run_name={name} ...` first")
    if not is_complete(folder) or read_meta(folder).get("stage") != "reward":
        raise ConfigError(f"eval.judge={name!r}: {folder} is not a complete reward model written by stage=reward "
                         f"(its meta.json is missing, incomplete or names another stage)")
    return folder


def judge_spec(cfg: DictConfig) -> str | None:
    """eval.judge as a reward source other than a trained model (reward.specs.open_source), or None:
    `pretrained:<folder or hub id>`, `function:<module:function>`, an http(s) URL, or a folder holding a
    pretrained sequence-classification model (config.json, no meta.json)."""
    name = cfg.eval.get("judge")
    if name is None:
        return None
    name = str(name)
    if name.startswith(("pretrained:", "function:", "http://", "https://")):
        return name
    folder = Path(name).expanduser()
    if folder.is_dir() and (folder / "config.json").is_file() and not is_complete(folder):
        return f"pretrained:{folder}"
    return None


def open_judge(cfg: DictConfig, device, folder: Path | None) -> RewardSource | None:
    """eval.judge opened as a reward source: a trained reward model's folder (judge_model), or judge_spec's."""
    spec = judge_spec(cfg)
    if spec is not None:
        return _opened(spec, device)
    return None if folder is None else trained_reward(folder, device)


def judge_warnings(judge: Path, proxy: Path) -> list[str]:
    """Why a judge may not be independent of the proxy (empty when nothing is found)."""
    if not is_complete(proxy):
        return []
    if judge.resolve() == proxy.resolve():
        return ["the judge is the proxy reward model itself (the same folder): not an independent judge"]
    weights = [{k: v for k, v in read_meta(p).get("files", {}).items() if k.endswith(".safetensors")}
               for p in (judge, proxy)]
    if weights[0] and weights[0] == weights[1]:
        return ["the judge has the same weights as the proxy reward model (a copy): not an independent judge"]
    from rsft.bt_fit import PAIR_HASHES_FILE

    hashes = [p / PAIR_HASHES_FILE for p in (judge, proxy)]
    missing = [str(h.parent) for h in hashes if not h.is_file()]
    if missing:
        return [f"overlap of training pairs not checked: {' and '.join(missing)} has no {PAIR_HASHES_FILE} "
                f"(trained before rsft recorded it)"]
    judge_pairs, proxy_pairs = (set(json.loads(h.read_text())["train"]) for h in hashes)
    shared = len(judge_pairs & proxy_pairs)
    if shared:
        return [f"{shared} of the judge's {len(judge_pairs)} training pairs are also training pairs of the proxy "
                f"reward model: the judge is not independent (train them on disjoint parts: "
                f"reward.data.parts=2, reward.data.part=0 / 1)"]
    return []


def judge_for(cfg: DictConfig, device, folder: Path | None, proxy: Path) -> tuple[RewardSource | None, str | None, list]:
    """eval.judge opened for an evaluation (stage=eval, online's snapshots): (the source or None without a judge, the
    name its metrics record, judge_warnings against the `proxy` reward folder, each logged here: such a judge shares
    the proxy's taste and cannot stand in for an oracle)."""
    warnings = judge_warnings(folder, proxy) if folder is not None else []
    for warning in warnings:
        log.warning("eval.judge=%s: %s", cfg.eval.judge, warning)
    judge = open_judge(cfg, device, folder)
    name = None if judge is None else str(folder if folder is not None else judge_spec(cfg))
    if name is not None:
        log.info("eval.judge: the evaluations are judged by %s", name)
    return judge, name, warnings


def calibrates(cfg: DictConfig) -> bool:
    """reward_source.calibrate, which a trained model does without (its scores are normalised by its own train set)."""
    return cfg.reward_source.kind != "trained" and bool(cfg.reward_source.calibrate)


def normalised_rewards(scorer: RewardSource, raw: list, calibrate: bool, source: str) -> tuple[list, dict | None]:
    """(reward_normalised of `raw`, the calibration or None): the scorer's own normalisation, or with `calibrate` the
    scored rows' own mean and std (rows that all score alike keep std 1); stage=score calibrates a round, online a
    mini-batch. `source` names the rows in the calibration's record."""
    values = [r for r in raw if r is not None]
    if not (calibrate and values):
        return scorer.normalise(raw), None
    mean, std = statistics.fmean(values), statistics.pstdev(values) or 1.0
    return ([None if r is None else (r - mean) / std for r in raw],
            {"rows": len(values), "mean": mean, "std": std, "source": source})


def score_rows(scorer: RewardSource, prompts, completions, rows: list[dict] | None = None, batch_size: int = 32,
               progress: bool = True) -> list[float | None]:
    """The source's raw rewards of policy samples (None: not scorable), prompts as the user wrote them (a
    source frames them as its model was trained); under a launcher each process scores its share (every
    W-th batch or row) and all get all: a row is the number its process gave, or None when that process
    found it not scorable (every other process leaves it None)."""
    shards = distributed.gather_each(scorer.score(list(prompts), list(completions), rows, batch_size, progress,
                                                  shard=(distributed.rank(), distributed.world_size())))
    return [next((part[i] for part in shards if part[i] is not None), None) for i in range(len(shards[0]))]


def scored_evaluation(ds, scorer: RewardSource, judge: RewardSource | None):
    """An evaluation's completions with their score columns, as stage=eval writes them and online's snapshots take
    them: reward and reward_normalised by `scorer`, judge and judge_normalised by `judge` (when set), and gold where
    the task has its oracle (rsft.metrics.gold_scores). Each row's other columns (a reference answer) reach the
    scorers."""
    from rsft.metrics import gold_scores

    rows = ds.remove_columns(["prompt", "completion"]).to_list()
    raw = score_rows(scorer, ds["prompt"], ds["completion"], rows, progress=False)
    ds = ds.add_column("reward", raw).add_column("reward_normalised", scorer.normalise(raw))
    if judge is not None:
        judged = score_rows(judge, ds["prompt"], ds["completion"], rows, progress=False)
        ds = ds.add_column("judge", judged).add_column("judge_normalised", judge.normalise(judged))
    gold = gold_scores(ds)
    return ds.add_column("gold", gold) if gold is not None else ds


def evaluated(ds, scorer: RewardSource, judge: RewardSource | None, judge_name: str | None, baseline):
    """(scored_evaluation of an evaluation's completions, their metrics): rsft.metrics.policy_metrics paired against
    `baseline` (the initial policy's scored completions, or None), with the judge's name; stage=eval's and online's."""
    from rsft.metrics import policy_metrics

    ds = scored_evaluation(ds, scorer, judge)
    metrics = policy_metrics(ds, baseline)
    if judge is not None:
        metrics["judge"] = judge_name
    return ds, metrics


def score_in_shards(scorer, shards, store: ShardStore) -> list[float | None]:
    """score_rows over each shard of rows in turn (`shards`: Arrow tables with the prompt and completion columns,
    the others each row's columns, as function sources read them), so that only a shard's rows are Python
    objects at a time: each finished shard's rewards are saved to `store` by every process (each its own file,
    ShardStore) and a rerun reuses the ones found there, so that all processes skip the same shards and meet
    at the same collectives."""
    raw: list[float | None] = []
    for index, shard in enumerate(shards):
        found = store.load(index)
        if found is None:
            found = score_rows(scorer, shard.column("prompt").to_pylist(), shard.column("completion").to_pylist(),
                               shard.drop_columns(["prompt", "completion"]).to_pylist())
            store.save(index, found)  # each process its own file (the same rows): every one resumes alike
        if len(found) != shard.num_rows:
            raise RuntimeError(f"the scorer returned {len(found)} rewards for the {shard.num_rows} completions of "
                               f"shard {index}")
        raw += found
    return raw


def score_batch(scorer: RewardSource, ds, calibrate: bool) -> list[dict]:
    """A mini-batch's completed rows (pruned prefixes left out) with reward and reward_normalised, as stage=score
    gives them (stage=online)."""
    from rsft.sampling.budget import PRUNED

    rows = [r for r in ds.to_list() if r["finish_reason"] != PRUNED]
    if not rows:
        return []
    others = [{k: v for k, v in r.items() if k not in ("prompt", "completion")} for r in rows]
    raw = score_rows(scorer, [r["prompt"] for r in rows], [r["completion"] for r in rows], others,
                             progress=False)
    normalised, _ = normalised_rewards(scorer, raw, calibrate, "the mini-batch")  # as stage=score's
    return [{**r, "reward": None if v is None else float(v), "reward_normalised": n}
            for r, v, n in zip(rows, raw, normalised)]
