"""TRL's GRPOTrainer against rsft on the verifiable task (issue 37): pass@1 at the same number of sampled
completions, wall time, sampled tokens, token entropy and how often a prompt's answers are all alike.

    python scripts/bench_grpo.py train --out runs/grpo --seed 0 --learning-rate 1e-5       # one GRPO run
    python scripts/bench_grpo.py compare runs/verifiable-s0 runs/grpo/grpo-s0-lr1e-05-lora-p8-t0.7 [...] [--plot PNG]
    python scripts/bench_grpo.py train --task demo-gold --out runs/grpo --seed 0 --learning-rate 1e-5
    python scripts/bench_grpo.py sweep --a RECIPE_TRIALS --b GRPO_TRIALS --record NAME   # each side's rate, on validation
    python scripts/bench_grpo.py compare --task demo-gold runs/demo-gold runs/grpo/grpo-demo-gold-s0-lr1e-05-lora-p8-t0.7

`--task demo-gold` is the ceiling on the demo task: its gold oracle (reward.gold:gold_reward, a perfect
verifier) is GRPO's only reward and rsft's `function` reward (`reward_source=function
reward_source.spec=reward.gold:gold_reward`), the default job's settings otherwise (3 rounds x 24 rotated
prompts x 8 = 576 completions, 48 new tokens), and `compare` reads the held-out gold instead of pass@1. A
completion's finish reason, which gold reads, is "stop" when its last token is an end-of-sequence token
(TRL passes the completion's token ids; a cut one ends without it), else "length".

`train` runs GRPOTrainer on the recipe's task (`+experiment=verifiable`: data=checkable's train prompts, the
checker reward.checkers.first_number as the only reward, the recipe's policy), for as many sampled
completions as the recipe's rounds sample (`--completions`, default data.limit x sample.num_samples x
loop.rounds = 64 x 8 x 3 = 1,536: every train prompt once, 8 completions each). The policy is saved at
`--points` evenly spaced steps and at the end, and each is evaluated by rsft's own `stage=eval`
(eval.policy=initial with policy=hf at that folder): the same held-out prompts, eval.num_samples, eval.seed and
sampling settings as every rsft evaluation, so completions pair by (prompt, sample index) across runs. It
writes `<out>/grpo-s<seed>-lr<lr>/`: `point_XX/` (each a run directory holding that policy's eval_initial/),
`policy_XX/` and `grpo.json` (the settings, the per-step logs, the training wall seconds and sampled tokens).

GRPO is configured as a TRL user matching rsft's recipe would configure it (issue 47); each setting that differs
from TRL's GRPOConfig defaults (1.16: num_generations 8, per-device batch 8 completions, no accumulation = one
prompt per optimiser step, loss_type dapo, beta 0, epsilon 0.2, temperature 1.0, linear decay, AdamW, every
weight trained) does so for a stated reason:
- temperature = --temperature, default the recipe's sample.temperature (0.7): both sides sample, and are
  evaluated, at one temperature;
- --mode lora (default: the recipe's sft.mode) trains peft's LoRA with the recipe's sft.lora settings (r=16),
  the adapter rsft's SFT trains; --mode full trains every weight;
- --prompts-per-step P (default 8) = gradient_accumulation_steps with per_device_train_batch_size =
  num_generations: TRL's GRPOConfig generates one batch per optimiser step of per_device_train_batch_size x
  processes x steps_per_generation (= gradient_accumulation_steps) completions, so P prompts x 8 completions make
  one update. With one prompt per update and an initial pass@1 of 0.16, a group of 8 has no right answer a
  quarter of the time (0.84^8) and gives no gradient; with 8 prompts an update holds about 6 groups that do;
- --device (default cuda where there is one): use_cpu on the CPU, bf16 on a GPU that has it, fp32 on the CPU
  (TRL's default bf16 is refused without a GPU);
- gradient_checkpointing=False: it re-runs the forward pass for a memory saving a 135M model does not need
  (on this CPU a reward model's step went from 5.5 s to 160 s with TRL's defaults, docs/results.md);
- max_completion_length = sample.max_new_tokens (the recipe's 16): the same answer budget as rsft's samples;
- learning_rate = --learning-rate (TRL's 1e-6 by default; a sweep gives the others on the command);
- max_steps = completions / (8 P), one pass; logging_steps=1; no saving, no reporting.
The first comparison (docs/results.md#against-trls-grpotrainer) ran TRL's defaults: `--temperature 1.0 --mode full
--prompts-per-step 1`. A run's folder names the settings: grpo-s<seed>-lr<lr>-<mode>-p<P>-t<temperature>.

`compare` reads rsft loop runs (their evaluations after each round, the wall seconds of the stages that
sampled, scored, selected and trained, and the tokens their samples hold: rsft.online_report.round_points)
and GRPO runs (their points, with the trainer's wall seconds and tokens), and prints per point: completions,
tokens, wall seconds, pass@1 with its 95% bootstrap interval over prompts and the paired difference to the
first run's last point; and for every point whose policy is on disk (all but an online run's intermediate
snapshots, so diversity can be read at equal pass@1), its mean, the mean token entropy of the policy on its
own held-out completions (at eval's sampling temperature), the share of held-out prompts whose answers (the
checker's reading: the first number, or none; on the demo the folded text) are all the same and the distinct
answers per prompt; then, at equal pass@1, each trained point of the other runs against the first run's point
of nearest mean: the paired differences (95% bootstrap over prompts) in distinct answers per prompt and in
the share of prompts whose answers are all alike. --plot draws pass@1 (or gold) against completions and
against wall seconds. The CPU is printed first.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rsft import stats  # noqa: E402
from rsft.errors import InputError, MissingInput, main_guard  # noqa: E402
from rsft.machine import commit, describe, machine, write_record  # noqa: E402
from rsft.paths import RunPaths  # noqa: E402
from rsft.store import is_complete, load_dataset_artifact  # noqa: E402

TASKS = {  # per task: rsft's settings, the prompt column its reward reads besides the text, the eval column compare
    # reads and its name, and the folder prefix of a GRPO run
    "verifiable": {"recipe": ["+experiment=verifiable"], "reads": "reference", "column": "reward", "truth": "pass@1",
                   "prefix": "grpo"},
    "demo-gold": {"recipe": ["reward_source=function", "reward_source.spec=reward.gold:gold_reward"], "reads": "task",
                  "column": "gold", "truth": "gold", "prefix": "grpo-demo-gold"},
}


def recipe(task: str) -> list[str]:
    return [*TASKS[task]["recipe"], "logger=none"]


def composed(overrides: list[str], task: str = "verifiable"):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from rsft.config import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=["stage=sample", *recipe(task), *overrides])


def checker_reward(prompts, completions, reference, **_):
    """GRPO's reward function: reward.checkers.first_number on the completions' text (TRL passes the dataset's
    `reference` column; a conversational completion is a list of messages)."""
    from reward.checkers import first_number

    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [0.0 if r is None else r for r in first_number(list(prompts), texts, list(reference))]


def gold_reward_for(eos_ids: set[int]):
    """GRPO's reward function on the demo task: reward.gold:gold_reward, with each completion's finish reason
    read from its token ids (TRL keeps the end-of-sequence token of a finished completion)."""
    from reward.gold import gold_reward

    def gold(prompts, completions, completion_ids, task, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        reasons = ["stop" if ids and ids[-1] in eos_ids else "length" for ids in completion_ids]
        return gold_reward(list(prompts), texts, list(task), reasons)

    return gold


def train(args) -> None:
    import torch
    from datasets import Dataset
    from omegaconf import OmegaConf
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rsft.data import chat_messages, load_prompts
    from rsft.models import load_policy, resolve_device

    cfg = composed([f"seed={args.seed}", *args.override], args.task)
    if args.threads:
        torch.set_num_threads(args.threads)
    completions = args.completions or int(cfg.data.limit) * int(cfg.sample.num_samples) * int(cfg.loop.rounds)
    prompts = load_prompts(OmegaConf.merge(cfg.data, {"limit": None, "rotate": False}), "train")
    column = TASKS[args.task]["reads"]
    rows = [{"prompt": chat_messages(p, cfg.data.get("system_prompt")), column: r}
            for p, r in zip(prompts["prompt"], prompts[column])]
    device = resolve_device(args.device)
    model, tokenizer, source = load_policy(cfg, None, torch.device("cpu"))  # the trainer places it on `device`
    temperature = float(cfg.sample.temperature) if args.temperature is None else args.temperature
    mode = str(cfg.sft.mode) if args.mode is None else args.mode
    if args.task == "verifiable":
        reward = checker_reward
    else:
        eos = model.generation_config.eos_token_id
        eos_ids = {*([] if eos is None else [eos] if isinstance(eos, int) else eos), tokenizer.eos_token_id}
        reward = gold_reward_for({i for i in eos_ids if i is not None})
    name = (f"{TASKS[args.task]['prefix']}-s{args.seed}-lr{args.learning_rate:g}-{mode}-p{args.prompts_per_step}"
            f"-t{temperature:g}")
    out = args.out / name
    out.mkdir(parents=True, exist_ok=True)
    on_gpu = device.type == "cuda"
    config = GRPOConfig(output_dir=str(out / "trainer"), use_cpu=not on_gpu,
                        bf16=on_gpu and torch.cuda.is_bf16_supported(), gradient_checkpointing=False,
                        temperature=temperature, gradient_accumulation_steps=args.prompts_per_step,
                        max_completion_length=int(cfg.sample.max_new_tokens), learning_rate=args.learning_rate,
                        logging_steps=1, save_strategy="no", report_to="none", seed=args.seed)
    per_step = config.per_device_train_batch_size * config.gradient_accumulation_steps  # completions an update
    steps = math.ceil(completions / per_step)
    config.max_steps = steps
    points = sorted({round(steps * (i + 1) / args.points) for i in range(args.points)})
    history: list[dict] = []

    class Points(TrainerCallback):
        """Keep every step's logs; save the policy at the evaluation points (outside the timed training)."""

        def __init__(self):
            self.saving = 0.0

        def on_log(self, _args, state, control, logs=None, **kwargs):
            history.append({**(logs or {}), "step": state.global_step})

        def on_step_end(self, _args, state, control, **kwargs):
            if state.global_step in points:
                started = time.perf_counter()
                saved = trainer.model
                if mode == "lora":  # a full model folder, as stage=eval reads it: the adapter merged into a copy
                    saved = copy.deepcopy(trainer.accelerator.unwrap_model(trainer.model)).merge_and_unload()
                saved.save_pretrained(out / f"policy_{state.global_step:04d}")
                tokenizer.save_pretrained(out / f"policy_{state.global_step:04d}")
                self.saving += time.perf_counter() - started

    callback = Points()
    peft = None
    if mode == "lora":
        from rsft.policy_training import lora_config

        peft = lora_config(cfg.sft)  # the recipe's adapter: rsft's SFT trains the same one
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer, callbacks=[callback], peft_config=peft)
    print(f"{describe(machine())}\nGRPO: {source} on {device}, {len(rows)} train prompts, {steps} updates x "
          f"{per_step} completions ({args.prompts_per_step} prompts x {config.num_generations}) = {steps * per_step} "
          f"(budget {completions}), {mode}, temperature {temperature:g}, lr {args.learning_rate:g}, evaluated after "
          f"updates {points}", flush=True)
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started - callback.saving
    logged = [entry for entry in history if "completions/mean_length" in entry]  # one entry an update
    record = {"task": args.task, "source": source, "steps": steps, "completions_per_step": per_step, "points": points,
              "learning_rate": args.learning_rate, "seed": args.seed, "train_seconds": wall, "mode": mode,
              "temperature": temperature, "prompts_per_step": args.prompts_per_step, "device": str(device),
              "tokens": sum(entry["completions/mean_length"] * per_step for entry in logged),
              "settings": {k: str(v) for k, v in config.to_dict().items()
                           if k in ("num_generations", "per_device_train_batch_size", "loss_type", "beta", "epsilon",
                                    "temperature", "learning_rate", "lr_scheduler_type", "max_completion_length",
                                    "scale_rewards", "num_iterations", "gradient_checkpointing", "bf16", "use_cpu",
                                    "gradient_accumulation_steps")},
              "logs": history, "machine": machine()}
    (out / "grpo.json").write_text(json.dumps(record, indent=2, default=str))
    print(f"GRPO trained in {wall:.0f} s (saving the points left out); evaluating the points", flush=True)
    others = [o for o in args.override if not o.startswith("policy")]  # the policy is the trained folder
    for step in points:
        subprocess.run([sys.executable, "-m", "rsft.run", "stage=eval", *recipe(args.task), "eval.policy=initial",
                        "policy=hf",
                        f"policy.name_or_path={out / f'policy_{step:04d}'}", f"run_name=point_{step:04d}",
                        f"paths.runs_root={out}", f"seed={args.seed}", *others], check=True, cwd=ROOT)
    print(f"written: {out}")


# ---- compare ----


def grpo_points(run: Path) -> list[dict]:
    record = json.loads((run / "grpo.json").read_text())
    batch, steps = record["completions_per_step"], record["steps"]
    per_step = {e["step"]: e for e in record["logs"] if "completions/mean_length" in e}
    points = []
    for step in record["points"]:
        folder = RunPaths(run / f"point_{step:04d}").initial_eval
        if not is_complete(folder):
            raise MissingInput(f"{folder}: missing; rerun `bench_grpo.py train` for {run.name}")
        points.append({"run": run.name, "point": f"step {step}", "completions": step * batch,
                       "tokens": round(sum(e["completions/mean_length"] * batch for s, e in per_step.items() if s <= step)),
                       "wall": record["train_seconds"] * step / steps, "eval": load_dataset_artifact(folder),
                       "policy": run / f"policy_{step:04d}"})
    return points


def rsft_points(run: Path) -> list[dict]:
    """A loop run's points (its folder), or an online run's snapshots (its online/ folder): the last one's
    policy is the one the entropy is measured on."""
    from rsft.online_report import online_points, round_points

    if run.name == "online":
        points = online_points(RunPaths(run.parent))
        for p in points:
            p["run"], p["policy"] = f"{run.parent.name} (online)", None
        points[-1]["policy"] = run / "policy"  # the policy it ends with (a save_pretrained folder)
        return points
    paths = RunPaths(run)
    points = round_points(paths)
    for i, p in enumerate(points):
        p["run"] = run.name
        p["policy"] = None if i == 0 else paths.policy(i - 1)
    return points


def answer(completion: str, task: str = "verifiable") -> str:
    """What counts as a completion's answer: the checker's reading (the first number, or none) on the verifiable
    task; on the demo the whole text, case and spacing folded."""
    if task != "verifiable":
        return " ".join(completion.lower().split())
    from reward.checkers import NUMBER

    found = NUMBER.search(completion)
    return found.group() if found else ""


def distinct_counts(ds, task: str) -> dict[tuple[str, int], float]:
    """Each prompt's number of distinct answers, keyed as rsft.stats pairs (one value per prompt); 1 = all alike."""
    by_prompt: dict[str, set] = {}
    for prompt_id, completion in zip(ds["prompt_id"], ds["completion"]):
        by_prompt.setdefault(prompt_id, set()).add(answer(completion, task))
    return {(prompt_id, 0): float(len(a)) for prompt_id, a in by_prompt.items()}


def mean_of(point: dict, column: str) -> float:
    return sum(point["eval"][column]) / len(point["eval"])


def at_equal_mean(series: list[list[dict]], column: str, task: str) -> None:
    """Diversity at equal pass@1: each trained point of the other runs against the first run's trained point whose
    mean is nearest, the paired difference (over prompts) of distinct answers per prompt and of the share of
    prompts whose answers are all alike."""
    def trained(points):
        return [p for p in points if p["completions"] > 0]

    means = {id(p): mean_of(p, column) for points in series for p in trained(points)}
    reference = trained(series[0])
    if not reference:
        return
    print(f"\n| run | point (mean) | {series[0][-1]['run']}'s nearest point (mean) | distinct answers per prompt, "
          f"minus it (paired) | all alike, minus it (paired) |")
    print("|---|---|---|---|---|")
    for points in series[1:]:
        for p in trained(points):
            near = min(reference, key=lambda r: abs(means[id(r)] - means[id(p)]))
            mine, theirs = distinct_counts(p["eval"], task), distinct_counts(near["eval"], task)
            alike = stats.paired_difference({k: float(v == 1) for k, v in mine.items()},
                                            {k: float(v == 1) for k, v in theirs.items()})
            print(f"| {p['run']} | {p['point']} ({means[id(p)]:.3f}) | {near['point']} ({means[id(near)]:.3f}) | "
                  f"{stats.shown(stats.paired_difference(mine, theirs), True)} | {stats.shown(alike, True)} |")


def token_entropy(policy: Path | None, ds, cfg, device_name: str = "auto") -> float:
    """The policy's mean next-token entropy (nats, at eval's temperature) over its own held-out completion tokens."""
    import torch

    from rsft.data import prompt_token_ids
    from rsft.models import load_policy, resolve_device

    device = resolve_device(device_name)
    if policy is None or is_complete(policy):  # the configured policy, or an rsft round's
        model, tokenizer, _ = load_policy(cfg, policy, device)
    else:  # a GRPO point: a save_pretrained folder of the trainer's model
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(policy).to(device)  # loaded on the CPU; the ids go to device
        tokenizer = AutoTokenizer.from_pretrained(policy)
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for prompt, completion_ids in zip(ds["prompt"], ds["completion_ids"]):
            if not completion_ids:
                continue
            ids, _ = prompt_token_ids(tokenizer, prompt, cfg.data.get("system_prompt"))
            sequence = torch.tensor([ids + list(completion_ids)], device=device)
            logits = model(input_ids=sequence).logits[0, len(ids) - 1:-1].float() / float(cfg.sample.temperature)
            logp = torch.log_softmax(logits, dim=-1)
            total += float(-(logp.exp() * logp).sum())
            count += len(completion_ids)
    return total / max(count, 1)


def compare(args) -> None:
    cfg = composed(list(args.override), args.task)
    print(describe(machine()))
    series = []
    for run in args.runs:
        if (run / "grpo.json").is_file():
            series.append(grpo_points(run))
        elif run.is_dir():
            series.append(rsft_points(run))
        else:
            raise MissingInput(f"{run}: no such folder; give an rsft loop run or a bench_grpo.py train output")
    column = TASKS[args.task]["column"]  # pass@1 over the held-out questions x eval.num_samples, or gold
    last = series[0][-1]
    theirs = stats.keyed(last["eval"]["prompt_id"], last["eval"]["sample_idx"], last["eval"][column])
    shown_as = TASKS[args.task]["truth"]
    print(f"\n| run | point | completions | tokens | wall s | {shown_as} [95% CI] | vs {last['run']} {last['point']} "
          f"(paired) |")
    print("|---|---|---|---|---|---|---|")
    for points in series:
        for p in points:
            mine = stats.keyed(p["eval"]["prompt_id"], p["eval"]["sample_idx"], p["eval"][column])
            if mine.keys() != theirs.keys():
                raise InputError(f"{p['run']} {p['point']}: other held-out completions than {last['run']}'s; use the "
                                 f"same data.eval_limit, eval.num_samples and eval.seed")
            mean = stats.bootstrap(stats.by_prompt(p["eval"]["prompt_id"], p["eval"][column]))
            diff = "" if p is last else stats.shown(stats.paired_difference(mine, theirs), True)
            print(f"| {p['run']} | {p['point']} | {p['completions']} | {p['tokens']} | {p['wall']:.0f} | "
                  f"{stats.shown(mean)} | {diff} |")
    # every point with a policy on disk (an online run keeps only its last), so diversity reads at equal pass@1
    print(f"\n| run | policy | {shown_as} | token entropy (nats) | prompts whose answers are all alike | "
          f"distinct answers per prompt |")
    print("|---|---|---|---|---|---|")
    first = series[0][0]
    for p in [first] + [p for points in series for p in points if p["policy"] is not None]:
        counts = list(distinct_counts(p["eval"], args.task).values())
        entropy = token_entropy(p["policy"], p["eval"], cfg, args.device)
        print(f"| {p['run']} | {p['point']} | {mean_of(p, column):.3f} | {entropy:.3f} | "
              f"{sum(c == 1 for c in counts) / len(counts):.2f} | {sum(counts) / len(counts):.2f} |")
    at_equal_mean(series, column, args.task)
    if args.plot is not None:
        plot(series, args.plot, column, shown_as)
        print(f"\nplot: {args.plot}")


def points_of(run: Path) -> list[dict]:
    """A run's trained points (completions > 0): a GRPO run's or an rsft loop run's."""
    if (run / "grpo.json").is_file():
        return grpo_points(run)
    if not run.is_dir():
        raise MissingInput(f"{run}: no such folder; give an rsft loop run or a bench_grpo.py train output")
    return [p for p in rsft_points(run) if p["completions"] > 0]


def pass_at_k_by_prompt(ds, column: str, k: int) -> dict[str, list[float]]:
    """{prompt_id: [pass@k]}: the unbiased estimate from the prompt's n evaluation samples (n >= k)."""
    correct: dict[str, list[float]] = {}
    for prompt_id, value in zip(ds["prompt_id"], ds[column]):
        correct.setdefault(prompt_id, []).append(float(value))
    for prompt_id, values in correct.items():
        if len(values) < k:
            raise InputError(f"pass@{k}: prompt {prompt_id} has {len(values)} evaluation samples; evaluate with "
                             f"eval.num_samples >= {k}")
    return {prompt_id: [stats.pass_at_k(len(v), int(sum(v)), k)] for prompt_id, v in correct.items()}


def phase_seconds(run: Path) -> dict:
    """Where a run's time went, by phase: an rsft run's seconds by stage (its artifacts' build_seconds); a GRPO run's
    training (sampling and updates happen inside TRL's loop, not separable from outside) and its evaluations."""
    metas = [json.loads(m.read_text()) for m in sorted(run.glob("**/meta.json"))]
    seconds: dict[str, float] = {}
    for meta in metas:
        phase = "evaluation" if meta.get("stage") == "eval" else meta.get("stage", "?")
        seconds[phase] = round(seconds.get(phase, 0.0) + float(meta.get("build_seconds") or 0.0), 1)
    if (run / "grpo.json").is_file():
        seconds["training (TRL: sampling and updates)"] = round(json.loads((run / "grpo.json").read_text())["train_seconds"], 1)
    return seconds


def range_of(ds, column: str, completions: int) -> dict:
    """One evaluation point's score and range (issue 48): its mean of `column` (pass@1 on the verifiable task), and
    where its samples carry them, the mean token entropy, the share of prompts whose answers are all alike and the
    distinct answers per prompt, as rsft's evaluations measure them (rsft.metrics.range_metrics)."""
    from rsft.metrics import range_metrics, rows_by_prompt

    metrics: dict = {}
    range_metrics(ds, rows_by_prompt(ds["prompt_id"]), metrics, {})
    scored = [v for v in ds[column] if v is not None]  # None: a completion the reward could not score
    if not scored:
        raise InputError(f"the point at {completions} completions has no scored {column!r} in its evaluation")
    return {"completions": completions, "pass_at_1": sum(scored) / len(scored),
            **{k: metrics.get(k) for k in ("mean_entropy", "alike_share", "distinct_answers")}}


def at_equal_pass_at_1(ranges: dict) -> list[dict]:
    """Issue 48's entropy row, per seed: A's last point against B's point whose pass@1 is nearest it (B's trained
    points), where both measured token entropy."""
    equal = []
    for seed, (a_points, b_points) in enumerate(zip(ranges["a"], ranges["b"])):
        last = a_points[-1]
        measured = [p for p in b_points if p["mean_entropy"] is not None]
        if last["mean_entropy"] is None or not measured:
            continue
        near = min(measured, key=lambda p: abs(p["pass_at_1"] - last["pass_at_1"]))
        equal.append({"seed": seed, "a": last, "b": near})
    return equal


def seeds(args) -> dict:
    """A against B over several training seeds, paired seed for seed (A's i-th run with B's i-th), at each budget of
    sampled completions both have a point at: pass@k of each side pooled over seeds and prompts, the paired
    difference with its two-level interval (rsft.stats.pooled_bootstrap), the verdict at the margin stated in the
    command (rsft.stats.verdict), each seed's own difference beside it, and each run's seconds by phase."""
    if len(args.a) != len(args.b):
        raise InputError(f"--a has {len(args.a)} runs and --b {len(args.b)}: pair them seed for seed, one each")
    column = TASKS[args.task]["column"]
    sides = {name: [{p["completions"]: p for p in points_of(run)} for run in runs]
             for name, runs in (("a", args.a), ("b", args.b))}
    budgets = sorted(set.intersection(*(set(points) for runs in sides.values() for points in runs)))
    if not budgets:
        raise InputError("the runs have no budget of sampled completions in common; train them with the same "
                         "--completions and --points (GRPO) as the recipe's rounds x data.limit x K")
    print(describe(machine()))
    print(f"\nA = {', '.join(map(str, args.a))}\nB = {', '.join(map(str, args.b))}\nmargin m = {args.margin:g} "
          f"(stated in the command), {len(args.a)} seed pair(s)\n")
    print("| completions | k | A pass@k [95% CI] | B pass@k [95% CI] | A - B (pooled) | per seed A - B | A vs B |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for budget in budgets:
        for k in args.ks:
            per = {name: [pass_at_k_by_prompt(points[budget]["eval"], column, k) for points in runs]
                   for name, runs in sides.items()}
            try:
                compared = stats.paired_over_seeds(per["a"], per["b"], args.margin)
            except ValueError as error:
                raise InputError(f"pass@{k} at {budget} completions: {error}") from None
            pooled = compared["a_minus_b"]
            print(f"| {budget} | {k} | {stats.shown(compared['a'])} | {stats.shown(compared['b'])} | "
                  f"{stats.shown(pooled, True)} | {', '.join(f'{d:+.3f}' for d in pooled['seed_means'])} | "
                  f"{pooled['verdict']} (m = {args.margin:g}) |")
            rows.append({"completions": budget, "k": k, **compared})
    print("\n| run | seconds by phase |\n|---|---|")
    phases = {str(run): phase_seconds(run) for run in (*args.a, *args.b)}
    for run, seconds in phases.items():
        print(f"| {run} | {', '.join(f'{k} {v:.0f}' for k, v in seconds.items())} |")
    ranges = {name: [[range_of(points[budget]["eval"], column, budget) for budget in sorted(points)] for points in runs]
              for name, runs in sides.items()}
    equal = at_equal_pass_at_1(ranges)
    print("\n| seed | A's last point: completions, pass@1, token entropy | B's point of the nearest pass@1 | "
          "A's entropy minus B's |\n|---|---|---|---|")
    for row in equal:
        a, b = row["a"], row["b"]
        print(f"| {row['seed']} | {a['completions']}, {a['pass_at_1']:.3f}, {a['mean_entropy']:.3f} | "
              f"{b['completions']}, {b['pass_at_1']:.3f}, {b['mean_entropy']:.3f} | "
              f"{a['mean_entropy'] - b['mean_entropy']:+.3f} |")
    record = {"record": args.record, "made_by": "scripts/bench_grpo.py seeds", "command": " ".join(sys.argv),
              "commit": commit(),
              "machine": machine(), "task": args.task, "margin": args.margin, "a": [str(r) for r in args.a],
              "b": [str(r) for r in args.b], "rows": rows, "seconds_by_phase": phases, "range": ranges,
              "at_equal_pass_at_1": equal}
    if args.record:
        out = write_record(args.record, record)
        print(f"\nrecord: {out.relative_to(ROOT)}")
    return record


def learning_rate_of(run: Path) -> float:
    """The rate a run trained at: a GRPO run's grpo.json, an rsft loop run's last policy's sft settings."""
    if (run / "grpo.json").is_file():
        return float(json.loads((run / "grpo.json").read_text())["learning_rate"])
    policies = sorted(run.glob("round_*/policy/meta.json"))
    if not policies:
        raise MissingInput(f"{run}: no trained policy (round_XX/policy/meta.json); give a finished loop run")
    return float(json.loads(policies[-1].read_text())["settings"]["learning_rate"])


def sweep(args) -> dict:
    """Each side's learning-rate trials (issue 47): every run's pass@1 and pass@k at its last point (the full
    budget), with 95% bootstrap intervals over the prompts it was evaluated on (a validation split), and the rate
    each side keeps by the rule stated here, before the runs: the highest pass@1 at the full budget, a tie going
    to the lower rate. The runs of one side differ only in their rate; both sides must have spent one budget."""
    column = TASKS[args.task]["column"]
    sides, budgets = {}, set()
    print(describe(machine()))
    for name, runs in zip(args.names, (args.a, args.b)):
        trials = []
        for run in runs:
            last = points_of(run)[-1]
            budgets.add(last["completions"])
            ks = {f"pass_at_{k}": stats.bootstrap(pass_at_k_by_prompt(last["eval"], column, k)) for k in args.ks}
            trials.append({"run": str(run), "learning_rate": learning_rate_of(run), "completions": last["completions"],
                           "prompts": len(set(last["eval"]["prompt_id"])), **ks})
        rates = [t["learning_rate"] for t in trials]
        if len(set(rates)) != len(rates):
            raise InputError(f"{name}: two runs share a learning rate ({rates}); give one run per rate")
        best = max(trials, key=lambda t: (round(t["pass_at_1"]["mean"], 12), -t["learning_rate"]))
        sides[name] = {"trials": sorted(trials, key=lambda t: t["learning_rate"]), "chosen": best["learning_rate"]}
        for t in sides[name]["trials"]:
            print(f"{name} lr {t['learning_rate']:g}: " + ", ".join(f"{k} {stats.shown(t[k])}" for k in ks)
                  + ("  <- kept" if t is best else ""))
    if len(budgets) != 1:
        raise InputError(f"the trials end at different budgets of sampled completions ({sorted(budgets)}); train "
                         f"every trial with the same budget")
    record = {"record": args.record, "made_by": "scripts/bench_grpo.py sweep", "command": " ".join(sys.argv),
              "commit": commit(), "machine": machine(), "task": args.task, "ks": args.ks,
              "rule": "the highest pass@1 at the full budget; a tie goes to the lower rate", "sides": sides}
    if args.record:
        out = write_record(args.record, record)
        print(f"record: {out.relative_to(ROOT)}")
    return record


def plot(series: list[list[dict]], out: Path, column: str = "reward", truth: str = "pass@1") -> None:
    from rsft.plotting import finish, interval_errorbar, pyplot

    fig, axes = pyplot().subplots(1, 2, figsize=(11, 4))
    start = series[0][0] if series[0][0]["point"] in ("initial", "after 0 mini-batches") else None
    for points in series:
        name = points[-1]["run"]
        if start is not None and points[0]["completions"] > 0:  # a GRPO run starts from the same initial policy
            points = [start, *points]
        shown = [stats.bootstrap(stats.by_prompt(p["eval"]["prompt_id"], p["eval"][column])) for p in points]
        for ax, x in zip(axes, ("completions", "wall")):
            interval_errorbar(ax, [p[x] for p in points], shown, label=name)
    for ax, label in zip(axes, ("completions sampled", "wall seconds (training side, evaluations left out)")):
        ax.set(xlabel=label, ylabel=f"held-out {truth} (95% interval over prompts)")
    finish(fig, axes, out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("train", help="one GRPO run and its evaluations")
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--learning-rate", type=float, default=1e-6, help="default: TRL's GRPOConfig default")
    run.add_argument("--completions", type=int, default=None,
                     help="sampled completions in all (default: the recipe's rounds x data.limit x K)")
    run.add_argument("--points", type=int, default=3, help="evaluations, evenly spaced, the last at the end")
    run.add_argument("--threads", type=int, default=0)
    run.add_argument("--task", choices=sorted(TASKS), default="verifiable")
    run.add_argument("--override", nargs="*", default=[], help="rsft config overrides (tests: the tiny policy)")
    run.add_argument("--temperature", type=float, default=None, help="default: the recipe's sample.temperature")
    run.add_argument("--mode", choices=("lora", "full"), default=None, help="default: the recipe's sft.mode")
    run.add_argument("--prompts-per-step", type=int, default=8,
                     help="prompts (of num_generations completions each) an optimiser step: gradient accumulation")
    run.add_argument("--device", default="auto", help="auto (cuda where there is one), cpu, cuda or cuda:N")
    cmp = sub.add_parser("compare", help="pass@1, wall time, tokens, entropy: rsft runs and GRPO runs")
    cmp.add_argument("runs", type=Path, nargs="+", help="the first is the reference of the paired differences; "
                     "an rsft loop run's folder, its online/ folder, or a GRPO run")
    cmp.add_argument("--task", choices=sorted(TASKS), default="verifiable")
    cmp.add_argument("--plot", type=Path, default=None, metavar="PNG")
    cmp.add_argument("--override", nargs="*", default=[], help="rsft config overrides (tests: the tiny policy)")
    cmp.add_argument("--device", default="auto", help="where token entropy is computed: auto, cpu, cuda or cuda:N")
    sds = sub.add_parser("seeds", help="A against B over several training seeds: pass@k pooled over seeds and prompts, "
                         "the verdict at a margin stated before, seconds by phase")
    sds.add_argument("--a", type=Path, nargs="+", required=True, help="A's runs, one per seed")
    sds.add_argument("--b", type=Path, nargs="+", required=True, help="B's runs, in the same seed order")
    sds.add_argument("--margin", type=float, required=True,
                     help="m >= 0, set before the runs: A is 'not worse' when the interval's low end is above -m")
    sds.add_argument("--ks", type=int, nargs="+", default=[1, 4, 8], help="the k of pass@k (at most eval.num_samples)")
    sds.add_argument("--task", choices=sorted(TASKS), default="verifiable")
    sds.add_argument("--record", default=None, metavar="NAME", help="also write docs/results/NAME.json")
    swp = sub.add_parser("sweep", help="each side's learning-rate trials on a validation split, and the rate each keeps")
    swp.add_argument("--a", type=Path, nargs="+", required=True, help="A's trials, one run per rate")
    swp.add_argument("--b", type=Path, nargs="+", required=True, help="B's trials, one run per rate")
    swp.add_argument("--names", nargs=2, default=["recipe", "GRPO"], metavar=("A", "B"))
    swp.add_argument("--ks", type=int, nargs="+", default=[1, 8], help="the k of pass@k (at most eval.num_samples)")
    swp.add_argument("--task", choices=sorted(TASKS), default="verifiable")
    swp.add_argument("--record", default=None, metavar="NAME", help="also write docs/results/NAME.json")
    args = parser.parse_args(argv)
    if args.command == "sweep":
        if 1 not in args.ks:
            raise InputError(f"--ks {args.ks}: the rule reads pass@1; include 1")
        sweep(args)
        return
    if args.command == "seeds":
        if not args.margin >= 0 or any(k < 1 for k in args.ks):
            raise InputError(f"--margin {args.margin} --ks {args.ks}: expected a margin >= 0 and every k >= 1")
        seeds(args)
        return
    if args.command == "train":
        for name, value, ok in (("--learning-rate", args.learning_rate, args.learning_rate > 0),
                                ("--points", args.points, args.points >= 1),
                                ("--completions", args.completions, args.completions is None or args.completions >= 1),
                                ("--prompts-per-step", args.prompts_per_step, args.prompts_per_step >= 1),
                                ("--temperature", args.temperature, args.temperature is None or args.temperature > 0)):
            if not ok:
                raise InputError(f"{name} {value}: expected "
                                 f"{'> 0' if name in ('--learning-rate', '--temperature') else 'at least 1'}")
        train(args)
    else:
        compare(args)


if __name__ == "__main__":
    main_guard(main)()
