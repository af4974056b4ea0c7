"""rsft.config: every check names a key the composed config has; the rules across groups that must come before
any work (loop.stop's truth, online refresh with a combination); a reward combination's weights and names."""

from __future__ import annotations

import ast
import dataclasses
import re

import pytest
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from rsft import config
from rsft.preflight import check_config
from rsft.errors import ConfigError
from tests.conftest import CONF_DIR, REPO, compose_cfg

# values that fail some check of nearly every setting: a word, numbers out of every range, the wrong types
BAD_VALUES = ["not-a-value", -(10 ** 9), 10 ** 15, 0, -1, 1.5, None, True, [-1], [3, 1], {"x": 1}]
# how a check's message starts: `<key>=<value>: expected ...` (rsft.config), `<key>: ...` or `<key> must ...`
# (rsft.sampling's rules, given the key), `<key>[i]=...` for an item of a list
MESSAGE_KEY = re.compile(r"([A-Za-z_][\w.]*)(\[\d+\])?(=|:| )")


def sections(cls):
    """A schema and every section nested in it (a field whose default is a Checked dataclass), depth first."""
    yield cls
    for field in dataclasses.fields(cls):
        if isinstance(field.default_factory, type) and issubclass(field.default_factory, config.Checked):
            yield from sections(field.default_factory)


def has_key(cfg, dotted: str) -> bool:
    node = cfg
    for part in dotted.split("."):
        if not OmegaConf.is_dict(node) or part not in node.keys():
            return False
        node = node._get_node(part)
    return True


@pytest.fixture(scope="module")
def composed(tmp_path_factory):
    """{schema class: (its group, a config composed with the option that uses it)} for every option in conf/."""
    root = tmp_path_factory.mktemp("configs")
    found = {config.RunConfig: ("", compose_cfg(root, "stage=loop", tiny=False))}
    for group in config.SCHEMAS:
        if group in ("run", "reward.backbone"):  # the top level; the backbones come with conf/reward/
            continue
        for option in sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")):
            cfg = compose_cfg(root, "stage=loop", f"{group}={option}", tiny=False)
            found[OmegaConf.get_type(cfg[group])] = (group, cfg)
            if group == "reward":
                found[OmegaConf.get_type(cfg.reward.backbone)] = ("reward", cfg)
    return found


def test_every_check_names_a_key_the_composed_config_has(composed):
    """Each setting's check, given values it refuses, names the setting by its full key: the group (put in
    front by rsft.preflight) then the section's place (its _AT, derived from where it sits: loop.stop.patience,
    not loop.patience). Every such key must be in the config composed from conf/ with that option."""
    registered = {cls for options in config.SCHEMAS.values() for cls in options.values()}
    assert registered <= set(composed), f"schemas no conf/ option uses: {registered - set(composed)}"
    checked, wrong = 0, []
    for schema, (group, cfg) in composed.items():
        for cls in sections(schema):
            for field in dataclasses.fields(cls):
                if config._field_check(cls, field.name) is None:
                    continue
                keys = set()
                for value in BAD_VALUES:
                    try:
                        cls(**{field.name: value})
                    except ValueError as error:  # a type OmegaConf refuses first (a list for an int) may fail
                        match = MESSAGE_KEY.match(str(error))  # otherwise here: only the refusals count
                        keys.add(match.group(1) if match else f"<no key in {str(error)[:60]!r}>")
                    except TypeError:
                        pass
                assert keys, f"{cls.__name__}.{field.name}: no value refused, so nothing was checked"
                checked += 1
                wrong += [(cls.__name__, field.name, f"{group}.{key}" if group else key) for key in keys
                          if not has_key(cfg, f"{group}.{key}" if group else key)]
    assert checked > 150 and not wrong, wrong


def test_a_rule_across_settings_names_its_key_from_where_the_section_sits():
    """The rules a schema's own __post_init__ writes name their keys as `self._AT + name` in a section that is
    nested anywhere, and as a field of the schema itself: read from rsft/config/, every _fail call."""
    tree = ast.Module(body=[node for path in sorted((REPO / "rsft" / "config").glob("*.py"))
                            for node in ast.parse(path.read_text()).body], type_ignores=[])
    classes = {cls.__name__: cls for options in config.SCHEMAS.values() for root in options.values()
               for cls in sections(root)}
    wrong, seen = [], 0
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or node.name not in vars(config):
            continue
        defined = vars(config)[node.name]
        users = [cls for cls in classes.values() if issubclass(cls, defined)]
        for call in ast.walk(node):
            if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "_fail"):
                continue
            seen += 1
            key = call.args[0]
            at = isinstance(key, ast.BinOp) and isinstance(key.left, ast.Attribute) and key.left.attr == "_AT"
            literal = key.right if at else key
            text = literal.value if isinstance(literal, ast.Constant) else \
                literal.values[0].value if isinstance(literal, ast.JoinedStr) else ""
            field = re.split(r"[.\[{]", text)[0]
            if not any(field == f.name for f in dataclasses.fields(defined)):
                wrong.append((node.name, text, "not a field of the schema"))
            if not at and any(cls._AT for cls in users):
                wrong.append((node.name, text, f"a literal key in a section nested at {users[0]._AT}"))
    assert seen > 10 and not wrong, wrong


def test_a_section_cannot_sit_at_two_places():
    @dataclasses.dataclass
    class Inner(config.Checked):
        n: int = config.setting(1, "n", check=config.at_least(1))

    @dataclasses.dataclass
    class One(config.Checked):
        first: Inner = config.setting(Inner, "here")

    @dataclasses.dataclass
    class Two(config.Checked):
        second: Inner = config.setting(Inner, "there")

    config._place_sections(One, "")
    assert Inner._AT == "first."
    with pytest.raises(ValueError, match=r"first\.n=0: expected an integer >= 1"):
        Inner(n=0)
    with pytest.raises(TypeError, match="sits at 'first.' and at 'second.'"):
        config._place_sections(Two, "")


@pytest.mark.parametrize("override,key", [
    ("loop.stop.patience=0", "loop.stop.patience=0"),
    ("loop.stop.min_gain=-0.5", "loop.stop.min_gain=-0.5"),
    ("loop.stop.truth=oracle", "loop.stop.truth='oracle'"),
])
def test_loop_stop_refusals_name_loop_stop(make_cfg, override, key):
    with pytest.raises(ConfigError, match=re.escape(key)):
        check_config(make_cfg("stage=loop", "loop.stop.enabled=true", override))


# ---------------------------------------------------------------- rules across groups, before any work


def test_stopping_on_the_judge_without_a_judge_is_refused_before_any_work(make_cfg, tmp_path):
    cfg = make_cfg("stage=loop", "loop.stop.enabled=true", "loop.stop.truth=judge")
    with pytest.raises(ConfigError) as refused:
        check_config(cfg)
    message = str(refused.value)
    assert message.startswith("loop.stop.truth=judge") and "eval.judge is not set" in message
    assert "set eval.judge=" in message and "loop.stop.truth=auto" in message
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("meta.json"))  # nothing built
    check_config(make_cfg("stage=loop", "loop.stop.enabled=true", "loop.stop.truth=auto"))
    check_config(make_cfg("stage=loop", "loop.stop.truth=judge"))  # loop.stop off: the truth is not read


ONLINE = ["stage=online", "online.refresh_every=2"]


def test_online_refresh_needs_a_trained_part_the_way_the_loop_does(make_cfg):
    """One rule (rsft.config.uses_trained_reward): a combination without a `trained` component has nothing to
    retrain, refused before any work; with one, it passes as the trained model does."""
    without = ["reward_source=combination", "+reward_source.components={a: {source: 'function:x.py:f', weight: 1}}"]
    with pytest.raises(ConfigError) as refused:
        config.check_across_groups(make_cfg(*ONLINE, *without), ("online", "reward_source"))
    message = str(refused.value)
    assert message.startswith("online.refresh_every=2")
    assert "reward_source=combination has no `source: trained` component" in message
    assert "online.refresh_every=0" in message
    with_trained = ["reward_source=combination",
                    "+reward_source.components={a: {source: 'function:x.py:f', weight: 1}, b: {source: trained}}"]
    for cfg in (make_cfg(*ONLINE, *with_trained), make_cfg(*ONLINE)):
        assert config.uses_trained_reward(cfg)
        config.check_across_groups(cfg, ("online", "reward_source"))
    with pytest.raises(ConfigError, match="reward_source=function does not use one"):
        config.check_across_groups(make_cfg(*ONLINE, "reward_source=function", "reward_source.spec=x.py:f"),
                                   ("online", "reward_source"))


# ---------------------------------------------------------------- a reward combination's weights and names


def test_a_mean_whose_weights_do_not_sum_above_zero_is_refused_naming_the_setting(make_cfg):
    def components(a, b):
        return ["reward_source=combination", "reward_source.combine=mean",
                f"+reward_source.components={{a: {{source: trained, weight: {a}}}, b: {{source: trained, "
                f"weight: {b}}}}}"]

    with pytest.raises(ConfigError) as refused:
        check_config(make_cfg("stage=score", *components(1, -3)))
    message = str(refused.value)
    assert message.startswith("reward_source.combine='mean': expected weights that sum to a positive number")
    assert "a: 1, b: -3 sum to -2" in message and "combine=sum" in message
    with pytest.raises(ConfigError, match="sum to 0"):
        check_config(make_cfg("stage=score", *components(2, -2)))
    for cfg in (make_cfg("stage=score", *components(2, -1)),  # a penalty, and a positive sum: a mean
                make_cfg("stage=score", *components(1, -3)[:-1], "reward_source.combine=sum", components(1, -3)[-1])):
        OmegaConf.to_object(cfg.reward_source)


@pytest.mark.parametrize("overrides,named", [
    (["+reward_source.components={a: {source: trained, weight: 1}, a: {source: 'function:f.py:g', weight: 2}}"],
     "reward_source.components: a given twice"),
    (["+reward_source.components={a: {source: trained}, b: {source: trained}}",
      "+reward_source.components.a={source: 'function:f.py:g'}"],
     "reward_source.components.a: the component 'a' is defined twice on the command line"),
    (["reward_source.components.x={source: trained}", "++reward_source.components.x={source: trained, weight: 2}"],
     "reward_source.components.x: the component 'x' is defined twice"),
    (["+reward_source.components={a: {source: trained, weight: 1, weight: 2}}"],
     "reward_source.components.a: weight given twice"),
])
def test_a_name_given_twice_on_the_command_line_is_refused(overrides, named):
    with pytest.raises(ConfigError) as refused:
        config.check_override_names(overrides)
    assert str(refused.value).startswith(named) and "its own name" in str(refused.value)


def test_names_given_once_pass_and_a_component_setting_is_not_a_component():
    config.check_override_names([
        "+reward_source.components={a: {source: 'function:x.py:f', weight: 1}, b: {source: trained}}",
        "reward_source.components.a.weight=3",  # one setting of a: not a second a
        "sample.prune.at=[3, 3]", "x={k: '{a: 1, a: 2}'}", "y=${oc.env:HOME,{a}}",  # a list, quoted text
        "z={k: 'it\\'s {a: 1, a: 2}', j: 1}",  # an escaped quote inside quoted text
    ])


def test_the_preflight_reads_the_command_line_hydra_ran(make_cfg, tmp_path):
    """Under `python -m rsft.run` Hydra records the command line's overrides: check_config reads them."""
    overrides = ["stage=score", "reward_source=combination",
                 "+reward_source.components={a: {source: trained}, a: {source: 'function:f.py:g'}}"]
    cfg = compose_cfg(tmp_path, *overrides)
    assert list(cfg.reward_source.components) == ["a"]  # what Hydra kept: one component, silently
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        with_hydra = compose("config", overrides=[f"paths.runs_root={tmp_path}/runs", *overrides],
                             return_hydra_config=True)
    HydraConfig.instance().set_config(with_hydra)
    try:
        with pytest.raises(ConfigError, match="reward_source.components: a given twice"):
            check_config(cfg)
    finally:
        HydraConfig.instance().cfg = None


def test_a_yaml_file_with_a_name_twice_is_refused_by_omegaconf(tmp_path):
    """A config file cannot give a component twice: OmegaConf's YAML loader refuses duplicate keys."""
    (tmp_path / "twice.yaml").write_text("components:\n  a: {source: trained}\n  a: {source: 'function:f.py:g'}\n")
    with pytest.raises(Exception, match="duplicate key a"):
        OmegaConf.load(tmp_path / "twice.yaml")


# ---------------------------------------------------------------- the pre-flight's added reads


@pytest.mark.parametrize("override, named, hint", [
    ("+sample.temprature=0.5", "sample.temprature", "did you mean sample.temperature?"),
    ("+sft.lora.rank=8", "sft.lora.rank", "its settings: r, alpha, dropout, target_modules"),
    ("+seeed=3", "seeed", "did you mean seed?"),
])
def test_a_key_added_with_plus_that_no_schema_has_is_refused(make_cfg, override, named, hint):
    with pytest.raises(ConfigError) as refused:
        check_config(make_cfg("stage=sample", override))
    assert str(refused.value).startswith(f"{named}: not a setting") and hint in str(refused.value)


def test_a_free_form_section_takes_any_key(make_cfg):
    check_config(make_cfg("stage=sample", "+sample.vllm.engine_args.enforce_eager=true"))


@pytest.mark.parametrize("stage, group", [("sft", "sft"), ("dpo", "dpo"), ("reward", "reward"),
                                          ("loop", "sft"), ("online", "online")])
def test_a_misspelt_schedule_is_refused_before_any_work(make_cfg, tmp_path, stage, group):
    with pytest.raises(ConfigError, match=re.escape(f"{group}.lr_scheduler='cosin': expected one of "
                                                    f"transformers' schedules: linear, cosine")):
        check_config(make_cfg(f"stage={stage}", f"{group}.lr_scheduler=cosin"))
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("meta.json"))


def test_train_prompts_that_cannot_be_read_stop_a_loop_without_evaluation_before_any_work(make_cfg, tmp_path):
    from rsft.errors import InputError

    empty = tmp_path / "prompts.jsonl"
    empty.write_text("")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n')
    cfg = make_cfg("stage=loop", "loop.eval=false", "data=local", f"data.path={empty}", f"reward.data.path={pairs}")
    with pytest.raises(InputError, match=re.escape(str(empty))):
        check_config(cfg)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("meta.json"))
