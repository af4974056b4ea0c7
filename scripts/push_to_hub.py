"""Push a finished run's trained policy and the completions it was trained on to the Hugging Face hub,
each with a card that says where it came from.

    python scripts/push_to_hub.py runs/demo --repo you/smollm2-rsft                 # policy + kept dataset
    python scripts/push_to_hub.py runs/demo --repo you/smollm2-rsft --dry-run       # print both cards, push nothing

The policy is the one the last round ended with: round_XX/dpo/ when that round ran DPO, else
round_XX/policy/ (a plain save_pretrained folder: LoRA is already merged). The dataset is that
round's selected/ (the kept completions SFT trained on, pooled over rounds as select.pool_rounds
said), pushed to <repo>-data as a dataset repo. Both go through transformers' and datasets' own
push_to_hub, so they need `huggingface-cli login` (or HF_TOKEN) and network access; rsft itself never
does. The pushed policy loads with AutoModelForCausalLM.from_pretrained("<repo>").

The cards (huggingface_hub's ModelCard and DatasetCard, README.md of each repo) are written from the
run's records, never from the current config: the base model, the method (best-of-K rejection sampling
fine-tuning, its rounds, K, selection, SFT / LoRA / DPO), the reward source, the held-out evaluation with
its 95% intervals (rsft.report, as summary.md shows it), the digests of the pushed artifacts and of
what they were made from, the machine and library versions the artifacts record, and the command that
reproduces the run: the `stage=loop` command Hydra logged in logs/*/.hydra whose config is the recorded
one, else one reconstructed from the recorded config against conf/.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import shlex
from pathlib import Path

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rsft.config import refresh_reward_on
from rsft.errors import ConfigError, MissingInput, main_guard
from rsft.paths import RunPaths
from rsft.report import evaluation_table, markdown_table, reward_table
from rsft.store import check_intact, is_complete, load_dataset_artifact, read_meta

CONF = Path(__file__).resolve().parents[1] / "conf"
CARD_TEMPLATE = "---\n{{ card_data }}\n---\n\n{{ body }}\n"  # huggingface_hub fills card_data with the YAML
# keys that never change a result, or that say where the run lives rather than what it did
NOT_COMPARED = ("stage", "round", "paths.cache_dir", "paths.run_dir")
# reward_source keys that only tune how a source is called
CALL_SETTINGS = ("timeout", "retries", "batch_size")


def final_artifacts(run: Path) -> tuple[int, Path, Path]:
    """(last round, its policy folder, its selected/ folder) of a run; MissingInput when it has none."""
    if not run.is_dir():
        raise MissingInput(f"run {run}: no such folder; give the run directory of a finished stage=loop (runs/<run_name>)")
    paths = RunPaths(run)
    last = None
    r = 0
    while paths.round_dir(r).exists():
        if is_complete(paths.policy(r)):
            last = r
        r += 1
    if last is None:
        raise MissingInput(f"{run} has no complete round_XX/policy/; run `python -m rsft.run stage=loop` first")
    config = read_meta(paths.policy(last)).get("config")
    dpo_run = isinstance(config, dict) and bool((config.get("loop") or {}).get("dpo"))
    if dpo_run and not is_complete(paths.dpo_policy(last)):
        # the card of a loop.dpo=true run describes a DPO policy: the SFT one under it would be mislabelled
        raise MissingInput(f"{run} ran with loop.dpo=true and the DPO step of round {last} is not built "
                           f"({paths.dpo_policy(last)} is missing or incomplete); finish it with `python -m rsft.run "
                           f"stage=loop` and the run's settings before pushing")
    policy = paths.dpo_policy(last) if is_complete(paths.dpo_policy(last)) else paths.policy(last)
    check_intact(policy)  # DamagedArtifact: never push weights that are not what the run wrote
    if not is_complete(paths.selected(last)):
        raise MissingInput(f"{run} has no complete round_{last:02d}/selected/ beside its policy; rerun "
                           f"`python -m rsft.run stage=loop` with the run's settings to rebuild it")
    return last, policy, paths.selected(last)


# -- the command that reproduces the run ------------------------------------------------------------------------


def flat(tree: dict, prefix: str = "") -> dict:
    """{"sample.num_samples": 8, ...}: the leaves of a nested config (an empty dict is a leaf)."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _compared(config: dict) -> dict:
    return {k: v for k, v in flat(config).items() if k not in NOT_COMPARED}


def logged_command(run: Path, config: dict) -> tuple[list[str], Path] | None:
    """(overrides, log folder) of the newest `stage=loop` command Hydra logged in the run (logs/*/.hydra)
    whose composed config is `config` (the recorded one); None when no logged loop command made it."""
    wanted = _compared(config)
    for hydra in sorted((run / "logs").glob("*/.hydra"), reverse=True):  # logs/<YYYYmmdd-HHMMSS>-<stage>
        try:
            overrides = OmegaConf.to_container(OmegaConf.load(hydra / "overrides.yaml"))
            logged = OmegaConf.to_container(OmegaConf.load(hydra / "config.yaml"), resolve=True)
        except (OSError, ValueError, yaml.YAMLError, OmegaConfBaseException):  # not Hydra's, or it no longer resolves
            continue
        if isinstance(overrides, list) and "stage=loop" in overrides and _compared(logged) == wanted:
            return [str(o) for o in overrides], hydra
    return None


def override_value(value) -> str:
    """A value as Hydra's override grammar reads it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(override_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{override_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if re.fullmatch(r"[A-Za-z_/][\w./:@+-]*", text) and text not in ("null", "true", "false"):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def reconstructed_command(config: dict) -> list[str]:
    """Overrides that compose `config` from conf/ with stage=loop: for each config group whose recorded
    values are not what the choices so far compose, the option whose values differ least (where it differs
    less), then every leaf that still differs."""
    from hydra import compose, initialize_config_dir

    from rsft.config import register_configs

    recorded = _compared(config)

    @functools.cache
    def leaves(overrides: tuple[str, ...]) -> dict | None:
        try:
            return _compared(OmegaConf.to_container(compose("config", overrides=["stage=loop", *overrides]),
                                                    resolve=True))
        except (ValueError, OmegaConfBaseException):  # an option that does not compose or resolve on its own
            return None

    def misses(overrides: tuple[str, ...], prefix: str) -> float:
        composed = leaves(overrides)
        if composed is None:
            return float("inf")
        keys = {k for k in (*recorded, *composed) if k.startswith(prefix)}
        return sum(composed.get(k, "<absent>") != recorded.get(k, "<absent>") for k in keys)

    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        choices: tuple[str, ...] = ()
        for group in sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name != "experiment"):
            options = sorted(p.stem for p in (CONF / group).glob("*.yaml"))
            here = misses(choices, f"{group}.") if group in config and len(options) > 1 else 0
            if not here:
                continue
            best = min(options, key=lambda o: misses((*choices, f"{group}={o}"), f"{group}."))
            if misses((*choices, f"{group}={best}"), f"{group}.") < here:
                choices = (*choices, f"{group}={best}")
        composed = leaves(choices) or {}
    changed = [f"{'' if key in composed else '+'}{key}={override_value(value)}"
               for key, value in recorded.items() if composed.get(key, "<absent>") != value]
    return [*choices, *changed]


def reproducing_command(run: Path, config: dict) -> tuple[str, str]:
    """(the command, where it comes from)."""
    logged = logged_command(run, config)
    if logged is not None:
        overrides, folder = logged
        how = f"the `stage=loop` command that made these artifacts, as Hydra logged it ({folder.relative_to(run)}/overrides.yaml)"
    else:
        overrides = ["stage=loop", *reconstructed_command(config)]
        how = ("reconstructed from the config recorded with the policy (meta.json) against conf/: no logged "
               "`stage=loop` command in logs/ composes it")
    return "python -m rsft.run " + " ".join(shlex.quote(o) for o in overrides), how


# -- what the cards say -----------------------------------------------------------------------------------------


def base_model(policy: dict) -> tuple[str, str | None]:
    """(how the card names the configured policy, its hub id for the card's base_model field or None)."""
    name = str(policy.get("name_or_path"))
    kind = policy.get("kind")
    if kind == "pypi_gguf":
        return f"`{policy.get('gguf_file')}` from the PyPI wheel `{policy.get('pypi_package')}` (dequantised)", None
    if kind == "tiny":
        return f"`{name}`, a tiny random model (policy=tiny, seed {policy.get('seed')})", None
    hub_id = re.fullmatch(r"[\w.-]+/[\w.-]+", name) and not Path(name).expanduser().exists()
    return f"`{name}` (policy.kind={kind})", name if hub_id else None


def reward_source_line(config: dict) -> str:
    source = config.get("reward_source") or {}
    kind = source.get("kind", "trained")
    shown = [k for k in source if k not in ("kind", *CALL_SETTINGS) and (k != "combine" or kind == "combination")]
    settings = ", ".join(f"{k}={json.dumps(source[k]) if isinstance(source[k], (dict, list)) else source[k]}"
                         for k in shown if source[k] not in (None, {}, [], False))
    if kind == "trained":
        reward = config.get("reward") or {}
        data = (reward.get("data") or {}).get("path") or "the run's own preference labels (prefs/)"
        backbone = (reward.get("backbone") or {}).get("name_or_path")
        refreshed = (" and retrained every round on every label so far (loop.refresh_reward)"
                     if refresh_reward_on(OmegaConf.create(config)) else "")
        line = (f"a Bradley-Terry reward model rsft trained (stage=reward) on {data}, backbone `{backbone}`"
                f"{refreshed}")
    else:
        line = f"reward_source={kind}"
    return line + (f" ({settings})" if settings else "")


def short_of_rounds(config: dict, last: int) -> str:
    """'' when the run did every round loop.rounds asked for; else a sentence saying how many it did."""
    loop = config.get("loop") or {}
    wanted = loop.get("rounds")
    if not isinstance(wanted, int) or last + 1 >= wanted:
        return ""
    stop = " (or loop.stop ended it early)" if (loop.get("stop") or {}).get("enabled") else ""
    return (f"only {last + 1} of loop.rounds={wanted} rounds are done{stop}; this is round {last}'s policy, not "
            f"the last round's")


def method_lines(config: dict, last: int, pushed: Path) -> list[str]:
    loop, sample, select, sft = (config.get(k) or {} for k in ("loop", "sample", "select", "sft"))
    dpo = config.get("dpo") or {}
    named, _ = base_model(config.get("policy") or {})
    lora = f" (LoRA r={(sft.get('lora') or {}).get('r')}, merged)" if sft.get("mode") == "lora" else ""
    lines = [
        f"- **Base model**: {named}",
        ("- **Method**: best-of-K rejection-sampling fine-tuning (rsft): each round samples K completions per prompt "
         "from the current policy, scores them with the reward source, keeps the best "
         f"(select.strategy={select.get('strategy')}, k={select.get('k')}, pool_rounds={select.get('pool_rounds')}) "
         "and fine-tunes on what it kept"),
        (f"- **Rounds**: {last + 1} (loop.rounds={loop.get('rounds')}); this is the policy round {last} ended with "
         f"(`{pushed.parent.name}/{pushed.name}`)"),
        (f"- **K** (sample.num_samples): {sample.get('num_samples')}, temperature {sample.get('temperature')}, "
         f"top_p {sample.get('top_p')}, max_new_tokens {sample.get('max_new_tokens')}"),
        f"- **Reward source**: {reward_source_line(config)}",
        (f"- **SFT**: {sft.get('mode')}{lora}, from the {sft.get('init')} policy, lr {sft.get('learning_rate')}, "
         f"{sft.get('epochs')} epoch(s)"),
    ]
    if short_of_rounds(config, last):
        lines.append(f"- **Unfinished**: {short_of_rounds(config, last)}")
    if loop.get("dpo"):
        lines.append(f"- **DPO** after SFT on best-vs-worst pairs: beta {dpo.get('beta')}, mode {dpo.get('mode')}, "
                     f"lr {dpo.get('learning_rate')}")
    data = config.get("data") or {}
    where = data.get("path") or data.get("name") or ""
    lines.append(f"- **Prompts**: data.kind={data.get('kind')}{' ' + str(where) if where else ''}, "
                 f"data.limit={data.get('limit')}; seed {config.get('seed')}")
    return lines


def provenance_rows(run: Path, artifacts: list[Path]) -> list[dict]:
    rows = []
    for path in artifacts:
        if not is_complete(path):
            continue
        meta = read_meta(path)
        inputs = meta.get("fingerprint", {}).get("inputs", {})
        rows.append({"artifact": str(path.relative_to(run)), "stage": meta.get("stage", ""),
                     "digest": meta.get("digest", ""),
                     "made from": ", ".join(f"{name} {digest}" for name, digest in inputs.items()),
                     "created": meta.get("created_at", "")})
    return rows


def machine_lines(machine: dict | None) -> list[str]:
    if not machine:
        return ["- not recorded (the artifacts were made before rsft recorded the machine)"]
    return [f"- {key}: {', '.join(map(str, value)) if isinstance(value, list) else 'none' if value is None else value}"
            for key, value in machine.items()]


def provenance_section(run: Path, artifacts: list[Path], pushed_meta: dict, command: str, how: str) -> list[str]:
    versions = pushed_meta.get("versions") or {}
    machines = {}
    for path in artifacts:
        if is_complete(path):
            machines.setdefault(json.dumps(read_meta(path).get("machine"), sort_keys=True), []).append(
                str(path.relative_to(run)))
    text = ["## Provenance", "",
            ("Every artifact of an rsft run records what made it (meta.json: the config keys its stage reads and the "
             "digests of the artifacts it read); its digest is a hash of that record and of its files."), "",
            markdown_table(provenance_rows(run, artifacts)), "",
            "### Machine", "", "The machine the pushed artifact was made on (its meta.json `machine`):", "",
            *machine_lines(pushed_meta.get("machine")), ""]
    if len(machines) > 1:
        text += ["Not every artifact was made on the same machine: " + "; ".join(
            f"{', '.join(names)} on {json.loads(m).get('cpu') if json.loads(m) else 'a machine not recorded'}"
            for m, names in machines.items()) + ".", ""]
    text += ["### Libraries", "", ", ".join(f"{k} {v}" for k, v in versions.items()) or "not recorded", "",
             "## Reproduce", "", f"{how[0].upper()}{how[1:]}:", "", "```", command, "```", ""]
    return text


def evaluation_section(paths: RunPaths, rounds: int, config: dict | None = None) -> list[str]:
    table = markdown_table(evaluation_table(paths, rounds))
    if not table:
        # the reason only where the recorded config gives it: else the evaluation was simply not built
        why = (" (loop.eval=false)" if ((config or {}).get("loop") or {}).get("eval") is False
               else ": no evaluation was built")
        return ["## Held-out evaluation", "", f"No complete evaluation in the run{why}.", ""]
    return ["## Held-out evaluation", "",
            ("Means over held-out prompts with 95% bootstrap intervals over prompts; `vs previous` is the paired "
             "difference to the row above (same prompts and sample seeds), `win rate vs initial` the paired "
             "P(this policy's completion beats the initial policy's). The `round r` row evaluates the policy "
             "round r ended with."), "", table, ""]


def size_category(rows: int) -> str:
    for bound, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M")):
        if rows < bound:
            return name
    return "n>1M"


def cards(run: Path, repo: str, with_dataset: bool):
    """(model card, dataset card or None) of a finished run, from its records."""
    from huggingface_hub import DatasetCard, DatasetCardData, ModelCard, ModelCardData

    last, policy, selected = final_artifacts(run)
    pushed_meta, kept_meta = read_meta(policy), read_meta(selected)
    config = pushed_meta.get("config")
    if not isinstance(config, dict):
        raise MissingInput(f"{policy / 'meta.json'} records no config (made by an rsft too old for this script); "
                           f"rerun the loop with overwrite=true to rebuild it")
    paths = RunPaths(run, run.parent, refresh_reward_on(OmegaConf.create(config)), bool(config.get("loop", {}).get("dpo")))
    command, how = reproducing_command(run, config)
    rewards = [paths.reward] + ([paths.scoring_reward(last)] if paths.scoring_reward(last) != paths.reward else [])
    artifacts = list(dict.fromkeys([policy, paths.policy(last), selected, paths.scored(last), paths.samples(last),
                                    *rewards, paths.eval(last), paths.initial_eval]))
    provenance = provenance_section(run, artifacts, pushed_meta, command, how)
    named, hub_base = base_model(config.get("policy") or {})
    tags = ["rsft", "rejection-sampling", "best-of-n", "sft"] + (["dpo"] if config.get("loop", {}).get("dpo") else [])
    reward_rows = reward_table(paths, last + 1)
    model_body = [f"# {repo}", "",
                  (f"{named} fine-tuned with rsft's best-of-K rejection sampling, {last + 1} round(s), "
                   f"from the run `{run.name}`."), "",
                  "## Method", "", *method_lines(config, last, policy), "",
                  *evaluation_section(paths, last + 1, config)]
    if reward_rows:
        model_body += ["## Reward models", "", markdown_table(reward_rows), ""]
    if with_dataset:
        model_body += ["## Training data", "", ("The completions the last round fine-tuned on: "
                                                f"[{repo}-data](https://huggingface.co/datasets/{repo}-data)."), ""]
    model_card = ModelCard.from_template(
        ModelCardData(base_model=hub_base, library_name="transformers", pipeline_tag="text-generation", tags=tags,
                      datasets=[f"{repo}-data"] if with_dataset else None),
        template_str=CARD_TEMPLATE, body="\n".join(model_body + provenance))
    if not with_dataset:
        return model_card, None
    kept = load_dataset_artifact(selected)
    select = config.get("select") or {}
    dataset_body = [
        f"# {repo}-data", "",
        (f"The completions rsft kept in round {last} of the run `{run.name}`: the best of K = "
         f"{(config.get('sample') or {}).get('num_samples')} samples per prompt by the reward source "
         f"(select.strategy={select.get('strategy')}, k={select.get('k')}), pooled over rounds "
         f"{kept_meta.get('rounds_pooled', 'not recorded')} (select.pool_rounds={select.get('pool_rounds')}). "
         f"SFT trained [{repo}](https://huggingface.co/{repo}) on them."), "",
        f"- **Rows**: {len(kept)}; columns: {', '.join(f'`{c}`' for c in kept.column_names)}",
        f"- **Counts**: {json.dumps(kept_meta.get('counts', {}))}",
        f"- **Sampled from**: {named}" + ("" if last == 0 else ", and in round r > 0 the policy round r - 1 ended "
                                          "with (each row's `policy` and `round`)"),
        f"- **Reward source**: {reward_source_line(config)}", "",
        "## Method", "", *method_lines(config, last, policy), ""]
    dataset_card = DatasetCard.from_template(
        DatasetCardData(pretty_name=f"rsft kept completions ({run.name}, round {last})", language=None,
                        task_categories=["text-generation"], size_categories=[size_category(len(kept))], tags=tags),
        template_str=CARD_TEMPLATE, body="\n".join(dataset_body + provenance))
    return model_card, dataset_card


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="the run directory, e.g. runs/demo")
    parser.add_argument("--repo", required=True, help="hub repo id for the policy; the dataset goes to <repo>-data")
    parser.add_argument("--private", action="store_true")
    parser.add_argument("--no-dataset", action="store_true", help="push the policy only")
    parser.add_argument("--dry-run", action="store_true", help="print what would be pushed and both cards, and stop")
    args = parser.parse_args(argv)
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(args.repo)
        validate_repo_id(f"{args.repo}-data")
    except HFValidationError as error:
        raise ConfigError(f"--repo {args.repo}: {error}") from None
    last, policy, selected = final_artifacts(args.run)
    model_card, dataset_card = cards(args.run, args.repo, not args.no_dataset)
    short = short_of_rounds(read_meta(policy).get("config") or {}, last)
    if short:
        print(f"warning: {short}")
    print(f"round {last}: policy {policy} -> {args.repo}")
    if dataset_card is not None:
        print(f"round {last}: kept completions {selected} -> {args.repo}-data (dataset)")
    if args.dry_run:
        print(f"\n----- model card: README.md of {args.repo} -----\n{model_card}")
        if dataset_card is not None:
            print(f"\n----- dataset card: README.md of {args.repo}-data -----\n{dataset_card}")
        return
    from huggingface_hub import create_repo
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(policy).push_to_hub(args.repo, private=args.private)
    AutoTokenizer.from_pretrained(policy).push_to_hub(args.repo, private=args.private)
    model_card.push_to_hub(args.repo)  # after the weights: it replaces the README transformers writes
    if dataset_card is not None:
        create_repo(f"{args.repo}-data", repo_type="dataset", private=args.private, exist_ok=True)
        dataset_card.push_to_hub(f"{args.repo}-data")  # first: datasets keeps an existing card's text, adds its metadata
        load_dataset_artifact(selected).push_to_hub(f"{args.repo}-data", private=args.private)


if __name__ == "__main__":
    main_guard(main)()
