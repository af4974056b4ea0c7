"""Rules across groups, keyed by the declared reads (rsft.stages.command_reads), not by stage names; the run
name; override names and renamed keys. rsft.preflight applies them before a command does any work.
"""

import dataclasses
import difflib
import os
from pathlib import PurePosixPath

from omegaconf import DictConfig, OmegaConf

from rsft import stages

from rsft.config.sample_settings import fewest_samples, k_schedule, most_samples, samples_per_prompt
from rsft.errors import ConfigError


def check_run_name(name, setting: str = "run_name") -> None:
    """A run name is a folder under paths.runs_root: `..` or an absolute path would write elsewhere, and an
    empty name would write into the runs root itself. Subfolders (sweeps/k8) are fine. The entry point
    also applies it to the command line before Hydra starts (Hydra creates its log folder under
    paths.run_dir first)."""
    text = "" if name is None else str(name)
    parts = PurePosixPath(text).parts
    if not text.strip() or not parts or text.startswith("/") or ".." in parts:
        raise ConfigError(f"{setting}={name!r}: expected a non-empty relative folder name (e.g. demo or sweeps/k8) "
                          f"without '..' components, not starting with '/'")


def check_run_dir(cfg) -> None:
    check_run_name(cfg.get("run_name"))
    root, run_dir = os.path.abspath(cfg.paths.runs_root), os.path.abspath(cfg.paths.run_dir)
    if run_dir == root or os.path.commonpath([root, run_dir]) != root:
        raise ConfigError(f"paths.run_dir={cfg.paths.run_dir!r}: expected a folder inside "
                          f"paths.runs_root={cfg.paths.runs_root!r}")


def check_unknown_settings(cfg, path: str = "") -> None:
    """Every key of a typed section (one whose schema is a dataclass: the run, each group, each nested section)
    is one of its dataclass's fields. Hydra refuses a misspelt key on the command line, but `+sample.temprature=0.5`
    (what Hydra's own refusal suggests) adds it to the config, where nothing reads it and the run would go on
    with the setting the user meant to change left as it was. A section typed as a plain dict (sample.vllm.
    engine_args) takes any key. The whole tree, not only the groups the command reads: a key that no stage
    reads is a mistake wherever it sits."""
    schema = OmegaConf.get_type(cfg)
    fields = [f.name for f in dataclasses.fields(schema)] if dataclasses.is_dataclass(schema) else None
    for key in cfg:
        name = f"{path}{key}"
        if fields is not None and key not in fields:
            near = difflib.get_close_matches(str(key), fields, n=1)
            hint = f"did you mean {path}{near[0]}?" if near else f"its settings: {', '.join(fields)}"
            raise ConfigError(f"{name}: not a setting of {path.rstrip('.') or 'the run'} ({hint}); a `+` override "
                              f"adds a key that nothing reads, so the run would go on without the change")
        if OmegaConf.is_missing(cfg, key) or OmegaConf.is_interpolation(cfg, key):
            continue
        child = cfg[key]
        if isinstance(child, DictConfig):
            check_unknown_settings(child, f"{name}.")


def refresh_reward_on(cfg) -> bool:
    """Whether each round is scored by a reward model retrained on that round's labels
    (loop.refresh_reward: true, false, or auto). `auto` (the default) turns it on where labels of the
    round's samples can be had, the demo task's simulated annotators or the user's `refresh.pairs`,
    and the selection reads the reward (a select.strategy=random baseline does not, so it skips the
    retraining); elsewhere off, so a loop on the user's own prompts runs without labels."""
    loop = cfg.get("loop") or {}
    value = loop.get("refresh_reward", False)
    if value != "auto":
        return bool(value)
    data, refresh, select = cfg.get("data") or {}, cfg.get("refresh") or {}, cfg.get("select") or {}
    labelled = data.get("kind") == "demo" or refresh.get("pairs") is not None
    return labelled and select.get("strategy") != "random" and uses_trained_reward(cfg)


def uses_trained_reward(cfg) -> bool:
    """Whether the configured reward (reward_source) needs this run's trained Bradley-Terry model, which
    stage=prefs and stage=reward build and stage=refresh retrains: kind=trained, or a combination with a
    `trained` component. The other sources are used as they are."""
    source = cfg.get("reward_source") or {}
    kind = source.get("kind", "trained")
    if kind == "combination":
        return any(str(c.get("source")) == "trained" for c in (source.get("components") or {}).values())
    return kind == "trained"


def simulated_labels_available(cfg) -> bool:
    """The demo task's simulated annotators read its gold oracle: only data=demo's prompts have one."""
    return cfg.data.kind == "demo"


def _check_guard_samples(guard, key: str, num_samples: int) -> None:
    """A guard on pass@k watches a measure that an evaluation of eval.num_samples answers a prompt reports only
    for k <= eval.num_samples: refused before any training, not at the first guarded evaluation."""
    k = guard.metric.rsplit("pass_at_", 1)[1] if guard.metric and "pass_at_" in guard.metric else None
    if k is not None and int(k) > num_samples:
        raise ConfigError(f"{key}.metric={guard.metric} needs {k} answers a held-out prompt, and eval.num_samples="
                          f"{num_samples} gives fewer: set eval.num_samples >= {k}, or watch pass_at_<k> with "
                          f"k <= {num_samples}")


def _check_online(cfg) -> None:
    """stage=online samples with the weights it is training, in memory, a mini-batch at a time."""
    _check_guard_samples(cfg.online.guard, "online.guard", cfg.eval.num_samples)
    if cfg.sample.num_samples == "auto":
        raise ConfigError("sample.num_samples=auto chooses a round's K from the previous round's evaluation, and "
                          "stage=online has no rounds: set sample.num_samples=<K> (e.g. 8)")
    if k_schedule(cfg.sample.num_samples) is not None:
        raise ConfigError(f"sample.num_samples={list(cfg.sample.num_samples)} is a K per round, and stage=online has "
                          f"no rounds: set sample.num_samples=<K> (e.g. 8)")
    if cfg.sample.get("backend", "rsft") != "rsft":
        raise ConfigError(f"sample.backend={cfg.sample.backend}: stage=online samples with the weights it is "
                          f"training, in memory, and a vLLM engine loads them from a folder; set sample.backend=rsft")
    if cfg.draft.kind not in ("none", "ngram"):
        raise ConfigError(f"draft={cfg.draft.kind}: a trained draft imitates one fixed policy, and stage=online's "
                          f"weights change every mini-batch; set draft=none or draft=ngram")
    if cfg.online.get("advantage_share") and cfg.select.get("strategy") != "advantage":
        raise ConfigError(f"online.advantage_share=true scales select.strategy=advantage's weights, and "
                          f"select.strategy={cfg.select.get('strategy')} has none; set online.advantage_share=false "
                          f"(or select.strategy=advantage)")
    if cfg.select.get("strategy") == "advantage":  # each step weighs whole prompts, whose weights sum to 0
        if cfg.online.replay > 0:
            raise ConfigError(f"online.replay={cfg.online.replay} with select.strategy=advantage: a replayed row's "
                              f"weight is its reward less the mean of its own mini-batch's samples, measured on a "
                              f"policy that has moved since, and the wrong answers among them would be pushed down "
                              f"again; set online.replay=0")
        rows = cfg.online.prompts_per_batch * samples_per_prompt(cfg.sample)
        if cfg.online.batch_size < rows:
            raise ConfigError(f"online.batch_size={cfg.online.batch_size} with select.strategy=advantage: a step on "
                              f"part of a mini-batch's rows can hold a prompt's wrong answers without its right ones, "
                              f"and only push down; expected at least online.prompts_per_batch x sample.num_samples = "
                              f"{rows}, so that every step holds every kept row of the mini-batch")
    if cfg.online.refresh_every > 0:
        if not simulated_labels_available(cfg):
            raise ConfigError(f"online.refresh_every={cfg.online.refresh_every} labels the mini-batches' samples with the "
                              f"demo task's simulated annotators, and data.kind={cfg.data.kind} has none (your labels, "
                              f"refresh.pairs, are labels of a round's samples); set online.refresh_every=0")
        if cfg.refresh.get("pairs") is not None:
            raise ConfigError(f"refresh.pairs={cfg.refresh.pairs}: your labels of a round's samples, and "
                              f"stage=online has no rounds; online.refresh_every uses the simulated annotators, so "
                              f"leave refresh.pairs unset (or set online.refresh_every=0)")
        if not uses_trained_reward(cfg):  # the one rule of what needs the trained model (refresh_reward's too)
            what = ("has no `source: trained` component" if cfg.reward_source.kind == "combination"
                    else "does not use one")
            raise ConfigError(f"online.refresh_every={cfg.online.refresh_every} retrains this run's trained reward "
                              f"model, and reward_source={cfg.reward_source.kind} {what}, so there is nothing to "
                              f"retrain; set online.refresh_every=0, or score with the trained model "
                              f"(reward_source=trained, or a combination component {{source: trained}})")


def _shown_k(sample) -> str:
    """sample.num_samples as a message shows it, with the fewest K a round gets where that differs."""
    value = sample.num_samples
    shown = str(list(value)) if k_schedule(value) is not None else str(value)
    return shown if shown == str(fewest_samples(sample)) else f"{shown}, whose fewest is {fewest_samples(sample)}"


def check_across_groups(cfg, groups) -> None:
    """The rules that span groups, for a command of stage cfg.stage reading `groups` (rsft.stages.groups_read). A
    rule about a setting applies to the commands that read it (rsft.stages.command_reads), not to stages by name."""
    reads = lambda key: stages.command_reads(cfg.stage, cfg, key)  # noqa: E731
    if "select" in groups and cfg.select.pairs and fewest_samples(cfg.sample) < 2:
        # checked against this run's sampling settings; pairs pooled across rounds are not counted
        raise ConfigError(f"select.pairs=true needs sample.num_samples >= 2 in every round (got "
                          f"{_shown_k(cfg.sample)}): a pair is the best and the worst completion of a prompt; or set "
                          f"select.pairs=false")
    # strategy=greedy takes the argmax at every step: K completions of one prompt are K copies of one, so
    # selection, pairs and labels have nothing to choose between (the run would end far later, elsewhere)
    if reads("sample.num_samples") and "sample" in groups and cfg.sample.strategy == "greedy" \
            and most_samples(cfg.sample) > 1:
        raise ConfigError(f"sample.strategy=greedy with sample.num_samples={cfg.sample.num_samples}: greedy decoding "
                          f"gives every completion of a prompt the same text; set sample.strategy=exact (sampling at "
                          f"sample.temperature), or sample.num_samples=1")
    if reads("prefs.num_samples") and "prefs" in groups and cfg.prefs.strategy == "greedy" \
            and cfg.prefs.num_samples > 1:
        raise ConfigError(f"prefs.strategy=greedy with prefs.num_samples={cfg.prefs.num_samples}: greedy decoding "
                          f"gives every completion of a prompt the same text, and the pairs labelled among them tie; "
                          f"set sample.strategy=exact (prefs.strategy follows it) or prefs.strategy=exact")
    # greedy decoding draws from no temperature's distribution: there is nothing to temper the loss to
    for group in ("sft", "online"):
        key = f"{group}.tempered_loss"
        if reads(key) and getattr(cfg, group).get("tempered_loss") and cfg.sample.strategy == "greedy":
            raise ConfigError(f"{key}=true divides the loss's logits by sample.temperature, and "
                              f"sample.strategy=greedy samples at none; set {key}=false (or sample.strategy=exact)")
    if reads("sft.loss_temperature") and cfg.sft.get("tempered_loss") and cfg.sft.loss_temperature != 1:
        raise ConfigError(f"sft.tempered_loss=true takes the loss at sample.temperature ({cfg.sample.temperature}) and "
                          f"sft.loss_temperature={cfg.sft.loss_temperature} at another: set one of them (sft."
                          f"tempered_loss=false to use sft.loss_temperature)")
    if "draft" in groups and cfg.sample.get("backend", "rsft") == "vllm" and cfg.draft.kind != "none":
        raise ConfigError(f"sample.backend=vllm samples without rsft's drafts: set draft=none (got draft="
                          f"{cfg.draft.kind}); vLLM's own speculative decoding is sample.vllm.engine_args."
                          f"speculative_config")
    # stage=prefs itself; the loop's own rule below says what it needs instead (its prefs runs only without pairs)
    if reads("prefs.num_samples") and not reads("loop.rounds") and not simulated_labels_available(cfg):
        raise ConfigError(f"stage=prefs simulates labels with the demo task's gold oracle, and data.kind="
                          f"{cfg.data.kind} has none; bring your own pairs instead: stage=reward "
                          f"reward.data.path=<your pairs> (reward.data.format=preference|hh_rlhf)")
    if "refresh" in groups and cfg.loop.refresh_reward is True and not uses_trained_reward(cfg):
        raise ConfigError(f"loop.refresh_reward=true retrains this run's Bradley-Terry model, and reward_source="
                          f"{cfg.reward_source.kind} does not use one; set loop.refresh_reward=false (or auto)")
    if "refresh" in groups and refresh_reward_on(cfg) and simulated_labels_available(cfg) \
            and cfg.refresh.pairs is None and fewest_samples(cfg.sample) < 2:
        # the demo's labels pair completions of one prompt: with one each, a refresh labels nothing
        raise ConfigError(f"loop.refresh_reward={f'{cfg.loop.refresh_reward}'.lower()} labels pairs among each "
                          f"prompt's first refresh.samples_per_prompt completions, and sample.num_samples="
                          f"{_shown_k(cfg.sample)} gives one: set sample.num_samples >= 2, or "
                          f"loop.refresh_reward=false")
    if "refresh" in groups and refresh_reward_on(cfg) and not simulated_labels_available(cfg) \
            and cfg.refresh.pairs is None:
        raise ConfigError(f"loop.refresh_reward=true with data.kind={cfg.data.kind} needs your labelled pairs of each "
                          f"round: refresh.pairs=<a folder with round_00.jsonl, round_01.jsonl, ...>; the "
                          f"simulated labels need the demo task's gold oracle")
    if reads("loop.rounds"):  # the rounds' driver
        if cfg.loop.dpo and not cfg.select.pairs:
            raise ConfigError("loop.dpo=true trains on the pairs stage=select writes; set select.pairs=true")
        if uses_trained_reward(cfg) and not simulated_labels_available(cfg) and cfg.reward.data.path is None \
                and not cfg.loop.reward_from:
            raise ConfigError(f"stage=loop with data.kind={cfg.data.kind} needs a reward model: reward.data.path=<your "
                              f"pairs> (or loop.reward_from=<a run with one>); the simulated labels of stage=prefs "
                              f"need the demo task's gold oracle")
        if cfg.loop.eval:
            _check_guard_samples(cfg.loop.guard, "loop.guard", cfg.eval.num_samples)
        # raise_kl multiplies the rounds' sft.kl: with none there is nothing to raise
        if cfg.loop.guard.metric is not None and cfg.loop.guard.action == "raise_kl" and not cfg.sft.kl > 0:
            raise ConfigError(f"sft.kl={cfg.sft.kl}: expected > 0 with loop.guard.action=raise_kl (the guard "
                              f"multiplies the rounds' KL weight by loop.guard.kl_factor at each crossing)")
        # widen_select raises the rounds' select.k after a crossing: k is top_k's, and it must grow
        if cfg.loop.guard.metric is not None and cfg.loop.guard.action == "widen_select":
            if cfg.select.strategy != "top_k":
                raise ConfigError(f"select.strategy={cfg.select.strategy}: expected top_k with "
                                  f"loop.guard.action=widen_select (the guard raises select.k, top_k's count)")
            if cfg.loop.guard.widen_k <= cfg.select.k:
                raise ConfigError(f"loop.guard.widen_k={cfg.loop.guard.widen_k}: expected more than "
                                  f"select.k={cfg.select.k} (the rounds after a crossing keep up to widen_k answers "
                                  f"a prompt)")
        if cfg.loop.reward_from:  # as rsft.loop reads it: empty = not set
            check_run_name(cfg.loop.reward_from, "loop.reward_from")
        # both read each round's evaluation: the best-of-N curve (auto K) and the gain over the round before
        if cfg.sample.num_samples == "auto" and not cfg.loop.eval:
            raise ConfigError("sample.num_samples=auto chooses each round's K from the previous round's evaluation "
                              "(its best-of-N curve): set loop.eval=true, or a number of samples")
        if cfg.loop.stop.enabled and not cfg.loop.eval:
            raise ConfigError("loop.stop.enabled=true stops on the rounds' gains on held-out prompts: set "
                              "loop.eval=true, or loop.stop.enabled=false")
        # the judge's column exists only where eval.judge names one (rsft.loop.stop_column reads it)
        if cfg.loop.stop.enabled and cfg.loop.stop.truth == "judge" and cfg.eval.get("judge") is None:
            raise ConfigError("loop.stop.truth=judge stops on the judge's gains, and eval.judge is not set: set "
                              "eval.judge=<a reward model folder, a run name or a reward spec>, or loop.stop.truth="
                              "auto (the judge when set, else gold where the task has an oracle)")
    if reads("online.minibatches"):
        _check_online(cfg)
    # stage=eval, and the loop with loop.eval (online evaluates on its own schedule, checked with it)
    evaluates = reads("eval.policy") and (cfg.loop.eval if reads("loop.eval") else True)
    if evaluates and cfg.data.kind == "local" and cfg.data.get("eval_path") is None:
        raise ConfigError("data.eval_path is not set: evaluation (stage=eval, or stage=loop with loop.eval=true) "
                          "needs held-out prompts of its own; add data.eval_path=<file> or set loop.eval=false")
    if evaluates and cfg.data.kind == "hub" and cfg.data.get("eval_split") is None:
        raise ConfigError(f"data.eval_split is not set: evaluation (stage=eval, or stage=loop with loop.eval=true) "
                          f"needs a held-out split of {cfg.data.name}; add data.eval_split=<split> or set "
                          f"loop.eval=false")


def _dict_keys(text: str) -> list[tuple[str, list[str]]]:
    """(the keys, in order) of every dict literal `{k: v, ...}` in a Hydra override's value, nested ones too,
    read from the text: Hydra's parser (and YAML's, were it not that OmegaConf refuses duplicate keys in a
    file) keeps the last of two equal keys without a word. A key's path is the keys above it, dotted."""
    found: list[tuple[str, list[str]]] = []
    stack: list[list | None] = []  # per open bracket: [path, keys] for a dict, None for a list or ${...}
    key, expecting, quote, escaped, previous, last_key = [], False, None, False, "", ""
    for ch in text:
        if quote:
            if ch == quote and not escaped:
                quote = None
            escaped = ch == "\\" and not escaped  # a backslash escapes the next character (Hydra's quoting)
            if expecting:
                key.append(ch)
            previous = ch
            continue
        if ch in "'\"":
            quote = ch
            if expecting:
                key.append(ch)
        elif ch == "{" and previous != "$":
            above = next((s[0] for s in reversed(stack) if s is not None), None)  # the dict this one is in
            path = "" if above is None else ".".join(p for p in (above, last_key) if p)
            stack.append([path, []])
            found.append((path, stack[-1][1]))
            key, expecting = [], True
        elif ch in "{[":  # ${...} or a list: no keys in it
            stack.append(None)
            expecting = False
        elif ch in "}]":
            if stack:
                stack.pop()
            expecting = False
        elif ch == "," and stack:
            expecting, key = stack[-1] is not None, []
        elif ch == ":" and expecting:
            last_key = "".join(key).strip().strip("'\"")
            stack[-1][1].append(last_key)
            expecting = False
        elif expecting:
            key.append(ch)
        previous = ch
    return found


COMPONENTS_KEY = "reward_source.components"


def check_override_names(overrides: list[str]) -> None:
    """The command line's overrides, read for names given twice (a setting's ConfigError): a dict literal with
    a key twice (`{a: ..., a: ...}`), and a reward combination's component defined twice (in two overrides of
    reward_source.components, as a dict's key or as reward_source.components.<name>=...). Hydra keeps the
    last of each without a word, so one component would vanish from the combination silently."""
    components: dict[str, str] = {}
    for override in overrides:
        key, equals, value = override.partition("=")
        key = key.lstrip("+~")
        if not equals:
            continue
        for path, keys in _dict_keys(value):
            twice = sorted({k for k in keys if keys.count(k) > 1})
            if twice:
                where = ".".join(p for p in (key, path) if p)
                raise ConfigError(f"{where}: {', '.join(twice)} given twice in `{override}`; the config would keep "
                                  f"only the last, and the first would vanish without a word: give each its own "
                                  f"name")
        if key == COMPONENTS_KEY:  # a dict of components: its top-level keys
            names = next((keys for path, keys in _dict_keys(value) if path == ""), [])
        elif key.startswith(COMPONENTS_KEY + ".") and "." not in key[len(COMPONENTS_KEY) + 1:]:
            names = [key[len(COMPONENTS_KEY) + 1:]]  # one whole component (not one of its settings)
        else:
            names = []
        for name in dict.fromkeys(names):
            if name in components:
                raise ConfigError(f"{COMPONENTS_KEY}.{name}: the component {name!r} is defined twice on the command "
                                  f"line (`{components[name]}` and `{override}`); the second would replace the first "
                                  f"without a word: give each component its own name")
            components[name] = override


# Settings renamed so that a newcomer can tell them apart (adaptive K is not draft.adaptive, adaptive gamma; the
# distilled draft's training group is not draft=model): old key or prefix -> new. The old spellings still work
# on the command line (rsft.run) with a note, and artifacts recorded under them still match (rsft.fingerprints).
RENAMED = {"sample.adaptive.budget": "sample.adaptive_k.mean", "sample.adaptive.": "sample.adaptive_k.",
           "draft_model.": "distill."}


def renamed_key(key: str) -> str:
    """A config key spelled the current way (RENAMED)."""
    for old, new in RENAMED.items():
        if key == old or (old.endswith(".") and key.startswith(old)):
            return new + key[len(old):] if old.endswith(".") else new
    return key
