"""Dependencies point one way (../shared/DESIGN.md): the import graph of rsft/ and reward/ has no
circle, counting imports inside functions too (a lazy import hides a circle, it does not remove it),
and the ground-floor modules import nothing above them."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rsft", "reward")
# modules every other may import: they import nothing of rsft or reward but what is listed here
GROUND_FLOOR = {
    "rsft.errors": {"reward.refusals"},  # the refusal types are defined in the reward/ leaf, which raises them too
    "rsft.interrupts": set(),
    "rsft.stages": set(),
    # the typed config, a module per group: its rules across groups key on the declared reads
    "rsft.config": {"rsft.config", "rsft.errors", "rsft.sampling", "rsft.stages", "reward.refusals"},
}


def module_files() -> dict[str, Path]:
    files = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The project modules a file imports, anywhere in it (`from rsft import stats` is rsft.stats)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
    return {name for name in found if name.split(".")[0] in PACKAGES}


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    return {name: imports_of(path, set(files)) - {name} for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_import_graph_has_no_circle():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle)


def test_the_checker_finds_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_ground_floor_modules_import_nothing_above_them():
    graph = import_graph()
    for floor, allowed in GROUND_FLOOR.items():
        for module in [m for m in graph if m == floor or m.startswith(floor + ".")]:  # a package: each module of it
            above = {m for m in graph[module] if not any(m == a or m.startswith(a + ".") for a in allowed)}
            assert not above, f"{module} imports {sorted(above)}"


def test_the_leaves_import_nothing_outside_them():
    """reward/ and rsft/sampling/ are leaves (../shared/DESIGN.md): models, rows and plain settings in, rewards or
    tokens out. reward/ imports nothing from rsft/, and rsft/sampling/ nothing of rsft outside it."""
    graph = import_graph()
    for module, imported in graph.items():
        if module.split(".")[0] == "reward":
            outside = {m for m in imported if m.split(".")[0] != "reward"}
        elif module.startswith("rsft.sampling"):
            outside = {m for m in imported if not m.startswith("rsft.sampling")}
        else:
            continue
        assert not outside, f"{module} imports {sorted(outside)}"


def name_stem(name: str) -> str:
    """A module name without the endings that make a near-twin of it: score / scoring / scores / scorer,
    label / labels / labelling, select / selection, train / training / trainer."""
    for ending in ("ling", "ing", "ion", "ers", "er", "es", "s", "e"):
        if name.endswith(ending) and len(name) - len(ending) >= 3:
            return name[: -len(ending)]
    return name


def test_no_two_modules_differ_only_by_an_ending():
    """One name per concept: no two modules of rsft/ and reward/ (packages counted apart: the reward/ package and
    a stage module may share no stem either) are the same word with another ending, so a newcomer can tell
    from a name which one holds a rule."""
    names = {}
    for module in module_files():
        *_, leaf = module.split(".")
        names.setdefault(name_stem(leaf), set()).add(module)
    twins = {stem: sorted(found) for stem, found in names.items() if len(found) > 1}
    assert not twins, twins


def test_the_stem_rule_finds_twins():
    assert name_stem("scoring") == name_stem("score") == name_stem("scorer")
    assert name_stem("labelling") == name_stem("labels")
    assert name_stem("selection") == name_stem("select")
    assert name_stem("training") == name_stem("trainer") == name_stem("train")
    assert name_stem("pairs") != name_stem("prefs")


def stage_modules() -> set[str]:
    from rsft.stages import STAGES

    return {stage.module for stage in STAGES}


def test_no_stage_module_imports_another_and_nothing_below_imports_a_stage():
    """A stage module imports services (rsft.generation, rsft.reward_service, ...), never another stage module, and
    nothing but the entry point's runner and the loop's driver reaches a stage (through rsft.runner)."""
    graph, stage_mods = import_graph(), stage_modules()
    for module, imported in graph.items():
        reached = imported & stage_mods
        assert not reached, f"{module} imports the stage module(s) {sorted(reached)}"



def test_no_module_reads_a_setting_through_a_cast_of_the_raw_config():
    """The settings are typed where they are declared (rsft.config's dataclasses, which Hydra's schema enforces:
    an int field holds an int): int(cfg.sample.max_new_tokens) says nothing the schema does not, and hides the
    place where a value of the wrong type came in. Conversions of a value to another type (an int count of
    epochs to TrainingArguments' float) are not reads; `.get(key, default)` of a key older configs may lack is
    not either."""
    import re

    cast = re.compile(r"\b(int|float|str)\((ctx\.)?cfg(\.[A-Za-z_][A-Za-z_0-9]*)+\)")
    # the sections a module binds to a name, read the same way
    sections = {"rsft/online.py": "online|guard", "rsft/loop.py": "stop|guard", "rsft/prefs.py": "p",
                "rsft/pairs.py": "refresh", "rsft/policy_training.py": "lora", "rsft/draft.py": "dcfg|train",
                "rsft/guard.py": "guard"}
    conversions = {("rsft/trl_common.py", "float(section.warmup_steps)"), ("rsft/trl_common.py", "float(section.epochs)")}
    offenders = []
    for path in sorted([*ROOT.glob("rsft/*.py"), *ROOT.glob("rsft/*/*.py"), *ROOT.glob("reward/*.py")]):
        name = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        found = [m.group(0) for m in cast.finditer(text)]
        if name in sections:
            found += re.findall(rf"\b(?:int|float|str)\((?:{sections[name]})\.[a-z_]+\)", text)
        offenders += [(name, f) for f in found if (name, f) not in conversions]
    assert not offenders, offenders


def test_no_module_branches_on_the_stage_name():
    """A rule about settings applies to the commands that read them (rsft.stages.command_reads, from each stage's
    declared reads), so a new stage that reads them gets the rule, and one that does not is not refused by it. The
    runner's dispatch (rsft.run, rsft.runner) looks a stage up by name; nothing else compares cfg.stage with one."""
    import re

    branch = re.compile(r"\.stage\s*(==|!=|in\b|not in\b)")
    offenders = [f"{path.relative_to(ROOT)}:{n}" for path in sorted([*ROOT.glob("rsft/*.py"), *ROOT.glob("rsft/*/*.py"), *ROOT.glob("reward/*.py")])
                 for n, line in enumerate(path.read_text().splitlines(), 1) if branch.search(line)]
    assert not offenders, offenders


def test_the_runner_loads_no_training_library():
    """The runner hands each training stage its checkpoint folder (rsft.checkpoints) without importing transformers:
    a stage that trains nothing does not pay for loading it (the stage modules that train import it themselves)."""
    import subprocess
    import sys

    probe = "import sys, rsft.runner; print(sorted(m for m in ('transformers', 'trl', 'peft') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout


def test_a_stages_build_reads_no_run_directory_place_its_plan_already_named():
    """Declared inputs (issue 46): a stage's plan names the places it reads once (Plan.inputs, Plan.given) and its
    build receives them from job.plan; build computing one again (`paths.samples(r)` in both) could read another
    place than the one fingerprinted."""
    import importlib
    import inspect

    from rsft.paths import RunPaths
    from rsft.stages import STAGES

    places = {name for name, _ in inspect.getmembers(RunPaths) if not name.startswith("_")}

    def read(function) -> set[str]:
        return {node.attr for node in ast.walk(function) if isinstance(node, ast.Attribute) and node.attr in places
                and (getattr(node.value, "id", None) == "paths" or getattr(node.value, "attr", None) == "paths")}

    again = {}
    for stage in (s for s in STAGES if s.artifact):
        tree = ast.parse(inspect.getsource(importlib.import_module(stage.module)))
        functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
        twice = read(functions["plan"]) & read(functions["build"])
        if twice:
            again[stage.name] = sorted(twice)
    assert not again, again
