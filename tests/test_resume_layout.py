"""How the resume point reaches the child: ``resume_arg`` (each placeholder, none, Hydra overrides,
paths a shell would split) and ``resume_env``. Plain data through ``child_plan``."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config import SupervisorConfig, load_config
from supervisor.errors import ConfigError
from supervisor.run.layout import child_plan, layout_for

CMD = ["python", "train.py", "--lr", "3e-4"]


def _plan(resume_path: str | None, resume_step: int | None = None, **cfg: object):
    config = SupervisorConfig(**cfg)  # type: ignore[arg-type]
    layout = layout_for(config, CMD, {}, Path("/work/exp"))
    return child_plan(config, CMD, {"HOME": "/home/me"}, layout, attempt=2, resume_path=resume_path,
                      resume_step=resume_step, control_address="udp://h:1", control_key="k")


@pytest.mark.parametrize("template, expected", [
    ("--ckpt_path {path}", ["--ckpt_path", "/ck/step=20.ckpt"]),
    ("--resume_from_checkpoint={path}", ["--resume_from_checkpoint=/ck/step=20.ckpt"]),
    ("--out_dir {dir}", ["--out_dir", "/ck"]),
    ("--resume-step {step} --load {dir}", ["--resume-step", "20", "--load", "/ck"]),
    ("+trainer.ckpt_path={path}", ["+trainer.ckpt_path=/ck/step=20.ckpt"]),
    ("--init_from=resume", ["--init_from=resume"]),
    ("trainer.resume=true", ["trainer.resume=true"]),
    ("resume_from_checkpoint=True ckpt_path=last", ["resume_from_checkpoint=True", "ckpt_path=last"]),
])
def test_each_resume_arg_form_is_appended_when_resuming(template: str, expected: list[str]) -> None:
    plan = _plan("/ck/step=20.ckpt", 20, resume_arg=template)
    assert list(plan.argv) == CMD + expected
    assert plan.resume_note is not None and "appended" in plan.resume_note


def test_nothing_is_appended_or_set_on_a_fresh_start() -> None:
    plan = _plan(None, resume_arg="--init_from=resume", resume_env=("RESUME_FROM={path}",))
    assert list(plan.argv) == CMD and "RESUME_FROM" not in plan.env and plan.resume_note is None


@pytest.mark.parametrize("path", ["/scratch/my run/step=20.ckpt", "/ck/a=b/step 20 'x\".ckpt", "/ck/$HOME;rm"])
def test_a_path_a_shell_would_split_stays_one_argument(path: str) -> None:
    plan = _plan(path, 20, resume_arg="+trainer.ckpt_path={path} --tag 'two words'")
    assert list(plan.argv) == CMD + [f"+trainer.ckpt_path={path}", "--tag", "two words"]
    plan = _plan(path, 20, resume_arg="--ckpt {path}")
    assert list(plan.argv)[-2:] == ["--ckpt", path]


def test_a_step_placeholder_with_an_unknown_step_is_not_given_and_says_why() -> None:
    plan = _plan("/ck/last.ckpt", None, resume_arg="--step {step}", resume_env=("S={step}", "P={path}"))
    assert list(plan.argv) == CMD
    assert plan.env["P"] == "/ck/last.ckpt" and "S" not in plan.env
    assert plan.resume_note is not None and "step of /ck/last.ckpt is unknown" in plan.resume_note


def test_the_environment_form_is_set_only_when_resuming() -> None:
    plan = _plan("/ck/checkpoint-30", 30, resume_env=("RESUME_FROM={path}", "RESUME_DIR={dir}",
                                                      "RESUME_STEP={step}", "RESUME=1"))
    assert (plan.env["RESUME_FROM"], plan.env["RESUME_DIR"], plan.env["RESUME_STEP"], plan.env["RESUME"]) == \
        ("/ck/checkpoint-30", "/ck", "30", "1")
    assert plan.env["SUPERVISOR_RESUME_FROM"] == "/ck/checkpoint-30" and list(plan.argv) == CMD


@pytest.mark.parametrize("value", ["--ckpt '{path}", "--ckpt {paht}", "   "])
def test_a_resume_arg_that_cannot_work_is_refused_naming_the_key(value: str) -> None:
    with pytest.raises(ConfigError, match="resume_arg"):
        load_config(environ={}, cli={"resume_arg": value})


def test_resume_env_from_the_command_line_is_checked_and_kept() -> None:
    cfg = load_config(environ={}, cli={"resume_env": ["RESUME_FROM={path}", "X=1"]})
    assert cfg.resume_env == ("RESUME_FROM={path}", "X=1")
    with pytest.raises(ConfigError, match="resume_env"):
        load_config(environ={}, cli={"resume_env": ["no-equals-sign"]})
