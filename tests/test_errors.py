"""rsft's error types and how the entry point ends on them: a refusal in one line, a bug with its traceback."""

from __future__ import annotations

import importlib.util
import inspect
import logging
import os
import re
import subprocess
import sys
import textwrap

import pytest
from omegaconf import OmegaConf

from rsft import errors
from rsft.errors import BUG_REPORT, ConfigError, InputError, MissingInput, RsftError
from rsft.run import config_read_problem, report_failure
from tests.conftest import REPO

HINT = "(RSFT_TRACEBACK=1 shows the traceback)"


def test_every_error_class_is_an_rsft_error_and_only_those_are_user_errors():
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass)
               if c.__module__ in (errors.__name__, "reward.refusals")]
    assert {c.__name__ for c in classes} >= {"RsftError", "ConfigError", "InputError", "MissingInput", "ArtifactError",
                                             "StaleArtifact", "DamagedArtifact", "RunDirectoryBusy"}
    assert all(issubclass(c, RsftError) and c.__doc__ for c in classes)
    assert errors.USER_ERRORS == (RsftError,)


@pytest.mark.parametrize("cls,builtin", [(errors.ConfigError, ValueError), (errors.InputError, ValueError),
                                         (errors.MissingInput, FileNotFoundError), (errors.ArtifactError, RuntimeError),
                                         (errors.StaleArtifact, RuntimeError), (errors.DamagedArtifact, RuntimeError),
                                         (errors.RunDirectoryBusy, RuntimeError)])
def test_each_error_is_still_caught_as_the_builtin_it_replaced(cls, builtin):
    with pytest.raises(builtin, match="^data.path='x.jsonl': no such file$"):
        raise cls("data.path='x.jsonl': no such file")
    assert str(cls("one line")) == "one line"


def test_missing_input_is_a_plain_file_not_found_error():
    error = MissingInput("runs/demo/round_00/samples is missing; run stage=sample")
    assert isinstance(error, OSError) and error.errno is None and str(error) == error.args[0]


@pytest.mark.parametrize("error", [InputError("data.path='p.jsonl', line 2: invalid JSON"),
                                   MissingInput("data.path='p.jsonl': no such file or folder"),
                                   errors.StaleArtifact("round_00/samples was built from other settings")])
def test_a_refusal_ends_in_one_line_without_a_traceback(error, caplog, monkeypatch):
    monkeypatch.delenv("RSFT_TRACEBACK", raising=False)
    with pytest.raises(SystemExit) as stop:
        report_failure(error)
    assert stop.value.code == f"{error}\n{HINT}"  # a str code: printed to stderr, exit status 1
    assert stop.value.__cause__ is None and stop.value.__suppress_context__
    assert not caplog.records


def test_rsft_traceback_shows_a_refusal_with_its_traceback(monkeypatch):
    monkeypatch.setenv("RSFT_TRACEBACK", "1")
    with pytest.raises(ConfigError, match="sft.init='latest'"):
        report_failure(ConfigError("sft.init='latest': expected initial or previous"))


@pytest.mark.parametrize("error", [KeyError("input_ids"), TypeError("unsupported operand"), ValueError("NaN"),
                                   FileNotFoundError(2, "No such file", "/tmp/x")])
def test_anything_else_is_a_bug_with_its_traceback(error, caplog):
    try:
        raise error  # give it a traceback, as a stage's would have
    except Exception as raised:
        with caplog.at_level(logging.ERROR, logger="rsft"), pytest.raises(SystemExit) as stop:
            report_failure(raised)
    assert stop.value.code == BUG_REPORT and "bug in rsft" in BUG_REPORT and "pip freeze" in BUG_REPORT
    [record] = caplog.records
    assert record.exc_info[1] is error and type(error).__name__ in record.getMessage()


def test_ctrl_c_says_how_to_resume_and_system_exit_passes(capsys):
    with pytest.raises(SystemExit) as stop:
        report_failure(KeyboardInterrupt())
    assert stop.value.code == 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped
    assert capsys.readouterr().err.startswith("interrupted; rerun the same command")
    with pytest.raises(SystemExit, match="no stage given"):
        report_failure(SystemExit("no stage given"))


def _error(read) -> Exception:
    try:
        read()
    except Exception as error:
        return error
    raise AssertionError("reading the key raised nothing")


def test_omegaconf_errors_while_reading_the_config_are_one_line_naming_the_key():
    cfg = OmegaConf.create({"data": {"kind": "local", "path": "???"},
                            "reward": {"data": {"data_dir": "${data.data_dir}", "path": "${data.path}",
                                                "split": "${oc.env:RSFT_NO_SUCH_VARIABLE}"}}})
    OmegaConf.set_struct(cfg, True)
    assert config_read_problem(_error(lambda: cfg.reward.data.data_dir)) == (
        "reward.data.data_dir reads data.data_dir, which this data= option does not have: set "
        "reward.data.data_dir=null (or another value) on the command line, or choose a data= option that has "
        "data.data_dir")
    assert config_read_problem(_error(lambda: cfg.reward.data.path)) == (
        "reward.data.path reads data.path, which is not set (???): add data.path=... (or reward.data.path=...) to "
        "the command")
    assert config_read_problem(_error(lambda: cfg.data.path)) == "data.path is not set (???): add data.path=... to the command"
    assert config_read_problem(_error(lambda: cfg.reward.data.split)).startswith(
        "reward.data.split cannot be resolved (KeyError raised while resolving interpolation")
    assert config_read_problem(_error(lambda: cfg.data["nope"])).startswith("data.nope is not in the composed config")
    assert config_read_problem(KeyError("data.nope")) is None  # not OmegaConf's: a bug
    with pytest.raises(SystemExit) as stop:
        report_failure(_error(lambda: cfg.reward.data.data_dir))
    assert stop.value.code.splitlines() == [config_read_problem(_error(lambda: cfg.reward.data.data_dir)), HINT]


# the entry point end to end (Hydra, its logging): run_stage replaced by what a stage might raise
DRIVER = textwrap.dedent("""
    import sys
    import rsft.errors, rsft.run

    def stage(cfg):
        if cfg.stage == "refuse":
            raise rsft.errors.InputError("data.path='p.jsonl', line 2: invalid JSON; expected one JSON object per line")
        if cfg.stage == "bug":
            return {}["input_ids"]
        return cfg.reward.data.data_dir  # stage=interpolation

    rsft.run.run_stage = stage
    rsft.run.main()
""")


@pytest.mark.parametrize("stage,overrides,last_line", [
    ("refuse", [], "data.path='p.jsonl', line 2: invalid JSON; expected one JSON object per line"),
    ("interpolation", ["data=local", "data.path=p.jsonl", "reward.data.data_dir=${data.data_dir}"],
     ("reward.data.data_dir reads data.data_dir, which data=local does not have: set reward.data.data_dir=null (or "
      "another value) on the command line, or choose a data= option that has data.data_dir")),
    ("bug", [], BUG_REPORT),
])
def test_the_command_ends_in_one_line_or_with_the_traceback_of_a_bug(tmp_path, stage, overrides, last_line):
    env = {k: v for k, v in os.environ.items() if k != "RSFT_TRACEBACK"}
    env["HYDRA_MAIN_MODULE"] = "__main__"  # find conf/ next to rsft/run.py, as `python -m rsft.run` does
    done = subprocess.run([sys.executable, "-c", DRIVER, f"stage={stage}", "logger=none",
                           f"paths.runs_root={tmp_path}", *overrides],
                          check=False, capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    if stage == "bug":
        assert "Traceback (most recent call last)" in output and "KeyError: 'input_ids'" in output
        assert done.stderr.strip().splitlines()[-1] == BUG_REPORT
        assert "KeyError: 'input_ids'" in "".join(p.read_text() for p in tmp_path.rglob("*.log"))  # the run's log
    else:
        assert "Traceback" not in output
        assert done.stderr.strip().splitlines() == [last_line, HINT]


# -- every other entry point: scripts/ and `python -m rsft.serve_reward` end through errors.main_guard -----------


def test_main_guard_ends_a_script_as_the_entry_point_ends_a_stage(caplog, monkeypatch, capsys):
    monkeypatch.delenv("RSFT_TRACEBACK", raising=False)

    def refuse(run):
        raise MissingInput(f"run {run}: no such folder; give a run directory")

    def bug():
        return {}["input_ids"]

    def interrupted():
        raise KeyboardInterrupt

    assert errors.main_guard(lambda a, b=0: a + b)(1, b=2) == 3  # what main returns, untouched
    with pytest.raises(SystemExit) as stop:
        errors.main_guard(refuse)("runs/x")
    assert stop.value.code == f"run runs/x: no such folder; give a run directory\n{HINT}" and not caplog.records
    with caplog.at_level(logging.ERROR, logger="rsft"), pytest.raises(SystemExit) as stop:
        errors.main_guard(bug)()
    assert stop.value.code == BUG_REPORT
    [record] = caplog.records
    assert isinstance(record.exc_info[1], KeyError)
    with pytest.raises(SystemExit) as stop:
        errors.main_guard(interrupted)()
    assert stop.value.code == 130 and capsys.readouterr().err == "interrupted\n"
    monkeypatch.setenv("RSFT_TRACEBACK", "1")
    with pytest.raises(MissingInput):
        errors.main_guard(refuse)("runs/x")


# -- optional packages: named before any work, in one line -------------------------------------------------------


@pytest.mark.parametrize("overrides,package,message", [
    (["stage=sample", "sample.backend=vllm"], "vllm", "sample.backend=vllm: vLLM cannot be imported here"),
    (["stage=sample", "logger=wandb"], "wandb", "logger=wandb needs the wandb package"),
    (["stage=sft", "sft.mode=lora"], "peft", "sft.mode=lora needs the peft package"),
    (["stage=loop", "loop.dpo=true", "select.pairs=true"], "peft", "dpo.mode=lora needs the peft package"),
    (["stage=sample", "policy=smollm2_135m"], "gguf", "policy.kind=pypi_gguf needs the gguf package"),
    (["stage=reward", "reward=policy"], "gguf", "reward.backbone.kind=pypi_gguf needs the gguf package"),
])
def test_an_optional_package_the_settings_need_is_named_before_any_work(make_cfg, tmp_path, monkeypatch, overrides,
                                                                        package, message):
    from rsft.preflight import check_config

    monkeypatch.setitem(sys.modules, package, None)  # an import of it fails, as when it is not installed
    cfg = make_cfg(*overrides, f"paths.cache_dir={tmp_path}/cache")  # nothing provisioned there
    with pytest.raises(errors.MissingPackage, match=rf"^{re.escape(message)}.*(pip install|sample.backend=rsft)"):
        check_config(cfg)
    monkeypatch.delitem(sys.modules, package)
    if package != "vllm" and importlib.util.find_spec(package) is not None:  # installed here: the same settings pass
        check_config(cfg)


def test_a_provisioned_gguf_policy_needs_no_gguf(make_cfg, tmp_path, monkeypatch):
    from rsft.preflight import check_config
    from rsft.store import atomic_artifact

    monkeypatch.setitem(sys.modules, "gguf", None)
    cfg = make_cfg("stage=sample", "policy=smollm2_135m", f"paths.cache_dir={tmp_path}")
    with atomic_artifact(tmp_path / "models" / cfg.policy.name_or_path, {"source": "test"}):
        pass
    check_config(cfg)


def test_the_vllm_engine_says_vllm_is_missing_as_a_user_error(monkeypatch):
    from rsft.sampling.batched import SamplingSettings
    from rsft.sampling.vllm_engine import VllmSampler

    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ImportError, match=r"needs vLLM: .*\((ModuleNotFound|Import)Error: ") as raised:
        VllmSampler("runs/demo/round_00/policy", SamplingSettings(8, 0.7, 4), [0], seed=0)
    assert "\n" not in str(raised.value)  # one line; rsft.generation and bench_sampling make it a user error


def test_sample_backend_vllm_without_vllm_ends_in_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RSFT_TRACEBACK"}
    driver = "import sys; sys.modules['vllm'] = None\nimport runpy; runpy.run_module('rsft.run', run_name='__main__')"
    done = subprocess.run([sys.executable, "-c", driver, "stage=sample", "sample.backend=vllm", "policy=tiny",
                           "logger=none", f"paths.runs_root={tmp_path}"], capture_output=True, text=True, cwd=REPO,
                          env={**env, "OMP_NUM_THREADS": "1"}, timeout=300, check=False)
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr, done.stderr
    line, hint = done.stderr.strip().splitlines()
    assert line.startswith("sample.backend=vllm: vLLM cannot be imported here") and hint == HINT
