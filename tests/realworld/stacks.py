"""The real-world suite's table: for each training stack, the command that runs its script, the
``supervise run`` flags it needs (docs/realworld.md shows the same table), its save interval, and how
to read the child's OWN output: the steps it reports, the saves it says it finished, the step it
says it resumed from. The tests judge the supervisor against those, never against the supervisor's
own opinion of the run.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from litgpt_setup import pretrain_command
from mace_setup import CHECKPOINT_DIR as MACE_CHECKPOINT_DIR
from mace_setup import CHECKPOINT_PREFIX as MACE_CHECKPOINT_PREFIX
from mace_setup import EPOCHS as MACE_EPOCHS
from mace_setup import train_command as mace_train_command
from torchtune_setup import CHECKPOINT_FILE, finetune_command
from torchtune_setup import EPOCH_STEPS as TUNE_EPOCH_STEPS
from torchtune_setup import EPOCHS as TUNE_EPOCHS

PY = sys.executable
SCRIPTS = Path(__file__).resolve().parent / "scripts"

# Every child of the suite: one thread (a tiny model on a shared 2-core machine is many times
# slower with several), and the HF libraries told they are offline.
CHILD_ENV = {
    "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1", "DISABLE_MLFLOW_INTEGRATION": "TRUE", "WANDB_DISABLED": "true",
    # litgpt's pretrain: litdata asks PyPI for a newer litdata on every data set it opens; and no
    # torch.compile (its CPU build of a model takes minutes on a loaded 2-core machine), as on a CPU one would.
    "LITDATA_DISABLE_VERSION_CHECK": "1", "TORCHDYNAMO_DISABLE": "1",
}


def segments(text: str) -> list[str]:
    """The child's output as lines, with every ``\\r`` redraw of a progress bar its own line."""
    return [seg for line in text.splitlines() for seg in line.split("\r") if seg.strip()]


@dataclass(frozen=True)
class ChildLog:
    """What a stack's child prints: ``progress`` gives the global step a line reports (or None),
    ``saved`` the step of a save the line announces, ``resumed`` the step the child says it resumed at."""

    progress: Callable[[str], int | None]
    saved: Callable[[str], int | None]
    resumed: Callable[[str], int | None]
    save_announced_before_write: bool = False  # the save line comes before the file is written
    resume_marker: str | None = None  # a line saying "resuming" without the step: the next step is it

    def steps(self, text: str) -> list[int]:
        return [s for s in map(self.progress, segments(text)) if s is not None]

    def completed_saves(self, text: str) -> list[int]:
        """Saves the child finished: announced after the write, or followed by a later step."""
        done, pending = [], None
        for line in segments(text):
            saved = self.saved(line)
            if saved is not None:
                if self.save_announced_before_write:
                    pending = saved
                else:
                    done.append(saved)
                continue
            step = self.progress(line)
            if pending is not None and step is not None and step >= pending:
                done.append(pending)
                pending = None
        return done

    def resumed_at(self, text: str) -> int | None:
        marked = False
        for line in segments(text):
            step = self.resumed(line)
            if step is not None:
                return step
            if self.resume_marker is not None and self.resume_marker in line:
                marked = True
            elif marked and self.progress(line) is not None:
                return self.progress(line)
        return None


def _group(pattern: str) -> Callable[[str], int | None]:
    rx = re.compile(pattern)

    def read(line: str) -> int | None:
        found = rx.search(line)
        return int(found.group(1)) if found else None
    return read


def _nanogpt_saved() -> Callable[[str], int | None]:
    """nanoGPT prints "step N: train loss ..." then "saving checkpoint to out": the save is of step N."""
    last_eval: list[int | None] = [None]
    eval_rx, save_rx = re.compile(r"^step (\d+): train loss"), re.compile(r"^saving checkpoint to ")

    def read(line: str) -> int | None:
        found = eval_rx.search(line)
        if found:
            last_eval[0] = int(found.group(1))
            return None
        return last_eval[0] if save_rx.search(line) else None
    return read


def _lightning_step(line: str) -> int | None:
    """TQDMProgressBar in a one-epoch run: "Epoch 0:  40%|...| b/N [...]", and after a resume mid-epoch
    "Training: |...| b/? [...]": b is the global step."""
    found = re.search(r"(?:Epoch 0|Training):\s+(?:\d+%)?\|[^|]*\|\s*(\d+)/(?:\d+|\?)\s*\[", line)
    return int(found.group(1)) if found else None


@dataclass(frozen=True)
class Stack:
    key: str
    stack: str
    script: str  # what the script is, for the docs table
    save_interval: int  # steps between saves: the most a crash may cost
    max_steps: int
    checkpoint_dir: str  # relative to the working directory
    resume_arg: str  # the --resume-arg the docs table gives
    path_is: str  # what {path} is for this stack
    command: Callable[[Path], list[str]]  # working directory -> argv
    log: ChildLog
    needs: tuple[str, ...] = ()  # modules that must import
    # False: after a resume the script checks the state it loaded and exits (Accelerate's test_checkpointing.py)
    trains_after_resume: bool = True
    # For a script that prints its step only once a save finished: (checkpoint dir, its last step) -> True
    # when its own record of that save is written and the next save has not begun (no save in flight).
    between_saves: Callable[[Path, int], bool] | None = None
    # In the one cluster preemption job by default (test_realworld.py; REALWORLD_CLUSTER_STACKS names any stack).
    on_cluster: bool = True
    # For a script whose output names no step the supervisor reads by itself: the --step-regex it needs.
    step_regex: str | None = None

    def supervise_flags(self, workdir: Path) -> list[str]:
        flags = ["--checkpoint-dir", str(workdir / self.checkpoint_dir), f"--resume-arg={self.resume_arg}"]
        return flags + ([f"--step-regex={self.step_regex}"] if self.step_regex else [])


# The public script the HF Trainer stack runs, as the pinned trl ships it (SOURCES.md).
TRL_SFT_SHA256 = "310f4eb5f750a8f2f1ca9ef86235455a6d1d262d1c4cf6c8261ad95090a209dc"
TRL_PIN = "trl==1.16.0"


def trl_sft_script() -> str:
    """The installed trl's sft.py, checked byte for byte against the pinned one."""
    import hashlib
    import importlib.util

    spec = importlib.util.find_spec("trl.scripts.sft")
    assert spec is not None and spec.origin, f"trl is not installed: pip install '{TRL_PIN}'"
    digest = hashlib.sha256(Path(spec.origin).read_bytes()).hexdigest()
    assert digest == TRL_SFT_SHA256, (f"{spec.origin} is not the pinned script (sha256 {digest}): "
                                      f"pip install '{TRL_PIN}'")
    return spec.origin


# The HF Trainer + DeepSpeed stack: the same public sft.py, with Trainer's DeepSpeed integration turned on by
# `--deepspeed ds_config.json` (the config a user writes; conftest.py writes this one in the working
# directory). "auto" takes the value from the Trainer's own flags, as the transformers docs configure it.
# ZeRO stage 2 (the other DeepSpeed row is stage 1). On the CPU, DeepSpeed picks its CPU accelerator and,
# without oneCCL installed, the gloo backend by itself: no setting is needed.
DS_CONFIG_FILE = "ds_config.json"
DS_CONFIG = {
    "zero_optimization": {"stage": 2},
    "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto", "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
}


# The public script the "Accelerate, save_state per epoch" stack runs, as the pinned accelerate ships it
# (SOURCES.md); tests/realworld/accelerate_setup.py makes the model, data set and metric it loads.
ACCELERATE_CKPT_SHA256 = "63f65a444f68d5cf1d37b5e3dd530bb487a61eec9d565dec44f3e0a709cdfe19"
ACCELERATE_PIN = "accelerate==1.15.0"
GLUE_TRAIN_PAIRS = 160  # 10 steps an epoch at the script's batch size of 16: its save interval
EPOCH_STEPS, EPOCHS = GLUE_TRAIN_PAIRS // 16, 30
SCRIPT_LR = 2e-5  # the script's config: linear decay to 0 over EPOCHS * EPOCH_STEPS steps, no warm-up


def accelerate_checkpointing_script() -> str:
    """The installed accelerate's test_utils/scripts/external_deps/test_checkpointing.py, checked byte for byte."""
    return pinned_script("accelerate.test_utils.scripts.external_deps.test_checkpointing", ACCELERATE_CKPT_SHA256,
                         ACCELERATE_PIN)


def pinned_script(module: str, sha256: str, pin: str) -> str:
    import hashlib
    import importlib.util

    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"{module} is not installed: pip install '{pin}'"
    digest = hashlib.sha256(Path(spec.origin).read_bytes()).hexdigest()
    assert digest == sha256, f"{spec.origin} is not the pinned script (sha256 {digest}): pip install '{pin}'"
    return spec.origin


def _epoch_line_step(line: str) -> int | None:
    """test_checkpointing.py prints, after save_state(epoch_<e>) and an evaluation:
    "epoch 2: {'accuracy': ..., 'lr': ..., 'optimizer_lr': ..., 'epoch': 2, 'step': 30}"."""
    found = re.search(r"^epoch \d+: \{.*'step': (\d+)\}", line)
    return int(found.group(1)) if found else None


def _resumed_step(line: str) -> int | None:
    """After a resume the script prints the learning rate it loaded ("resumed checkpoint's scheduler's
    lr: X") and asserts it equals the one it recorded for that epoch; its linear schedule gives the step."""
    found = re.search(r"^resumed checkpoint's scheduler's lr: (\S+)$", line)
    if not found:
        return None
    total = EPOCHS * EPOCH_STEPS
    return round(total * (1 - float(found.group(1)) / SCRIPT_LR))


def _epoch_save_settled(checkpoint_dir: Path, step: int) -> bool:
    """The line of step S came after the save of epoch S/10 - 1: its state_<e>.json is whole (the
    resume reads it; the script writes it with a plain open and json.dump after printing the line,
    so a file that merely exists may still be empty or cut) and epoch_<e+1>/ is not begun."""
    epoch = step // EPOCH_STEPS - 1
    try:
        state = json.loads((checkpoint_dir / f"state_{epoch}.json").read_text())
    except (OSError, ValueError):
        return False
    return state.get("step") == step and not (checkpoint_dir / f"epoch_{epoch + 1}").exists()


# What HF Trainer prints (the sft.py rows, with or without DeepSpeed).
HF_TRAINER_LOG = ChildLog(progress=_group(r"^\s*\d+%\|[^|]*\|\s*(\d+)/\d+ \["),  # the bar without a title
                          saved=_group(r"Saving model checkpoint to \S*checkpoint-(\d+)$"),
                          resumed=_group(r"Resuming training from checkpoint with epoch \d+ and global step (\d+)"),
                          save_announced_before_write=True)


def _tune_epoch_step(pattern: str) -> Callable[[str], int | None]:
    """torchtune's recipe names its saves by epoch (``out/epoch_<e>/``, from 0) and saves after each epoch of
    ``TUNE_EPOCH_STEPS`` steps: the save of epoch e is of step (e + 1) * TUNE_EPOCH_STEPS."""
    rx = re.compile(pattern)

    def read(line: str) -> int | None:
        found = rx.search(line)
        return (int(found.group(1)) + 1) * TUNE_EPOCH_STEPS if found else None
    return read


def _mace_save_whole(checkpoint_dir: Path, epoch: int) -> bool:
    """MACE prints "Epoch N: head: ..." and then saves checkpoints/<name>_run-<seed>_epoch-<N>.pt with
    torch.save, in place: with the training stopped, its save of epoch N is finished once that file
    is a whole zip (torch.save writes the zip's directory last). Its next save comes after the next
    epoch line."""
    import zipfile

    try:
        with zipfile.ZipFile(checkpoint_dir / f"{MACE_CHECKPOINT_PREFIX}{epoch}.pt"):
            return True
    except (OSError, zipfile.BadZipFile):
        return False


# What MACE's run_train prints through its logger: "2026-12-02 15:11:18.437 INFO: Epoch 7: head: Default,
# loss=..." after each epoch's evaluation; after a restart, "Loading checkpoint: ./checkpoints/..._epoch-7.pt"
# (it then trains epoch 7 again: MACE starts at the epoch of the checkpoint it loaded).
MACE_EPOCH_LINE = r"Epoch (\d+): head:"


STACKS: tuple[Stack, ...] = (
    Stack(
        key="nanogpt", stack="plain PyTorch, nanoGPT conventions",
        script="tests/realworld/scripts/nanogpt_style.py: one in-place out/ckpt.pt, step under iter_num",
        save_interval=20, max_steps=200, checkpoint_dir="out", resume_arg="--init_from=resume",
        path_is="not used: the script resumes from its own out/ckpt.pt",
        command=lambda w: [PY, str(SCRIPTS / "nanogpt_style.py"), "--eval_interval=20", "--max_iters=200"],
        log=ChildLog(progress=_group(r"^iter (\d+): loss"), saved=_nanogpt_saved(),
                     resumed=lambda line: None, save_announced_before_write=True,
                     resume_marker="Resuming training from out"),
    ),
    Stack(
        key="hf_trainer", stack="HF Trainer",
        script="trl/scripts/sft.py of the installed trl (a public script, unchanged): checkpoint-N/ dirs",
        save_interval=20, max_steps=120, checkpoint_dir="out", resume_arg="--resume_from_checkpoint {path}",
        path_is="the checkpoint-N directory",
        command=lambda w: [PY, trl_sft_script(), "--model_name_or_path", "model", "--dataset_name", "data",
                           "--output_dir", "out", "--max_steps", "120", "--save_steps", "20", "--logging_steps", "1",
                           "--per_device_train_batch_size", "4", "--max_length", "32", "--report_to", "none",
                           "--log_level", "info", "--save_total_limit", "3", "--use_cpu", "--bf16", "false"],
        log=HF_TRAINER_LOG,
        needs=("trl", "datasets"),
    ),
    Stack(
        key="hf_deepspeed", stack="HF Trainer + DeepSpeed (ZeRO 2, `torchrun`)",
        script="trl/scripts/sft.py of the installed trl (a public script, unchanged) with --deepspeed: "
               "checkpoint-N/ dirs, each holding DeepSpeed's global_stepN/ + latest",
        save_interval=20, max_steps=120, checkpoint_dir="out", resume_arg="--resume_from_checkpoint {path}",
        path_is="the checkpoint-N directory (Trainer loads the DeepSpeed tag in it)",
        command=lambda w: [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", trl_sft_script(),
                           "--model_name_or_path", "model", "--dataset_name", "data", "--output_dir", "out",
                           "--max_steps", "120", "--save_steps", "20", "--logging_steps", "1",
                           "--per_device_train_batch_size", "4", "--max_length", "32", "--report_to", "none",
                           "--log_level", "info", "--save_total_limit", "3", "--use_cpu", "--bf16", "false",
                           "--deepspeed", DS_CONFIG_FILE],
        log=HF_TRAINER_LOG,
        needs=("trl", "datasets", "deepspeed"),
    ),
    Stack(
        key="accelerate", stack="Accelerate",
        script="tests/realworld/scripts/accelerate_style.py: save_state, automatic naming checkpoints/checkpoint_<i>",
        save_interval=20, max_steps=1000, checkpoint_dir="out/checkpoints",
        resume_arg="--resume_from_checkpoint {path}", path_is="the checkpoint_<i> directory",
        command=lambda w: [PY, str(SCRIPTS / "accelerate_style.py"), "--checkpointing_steps", "20",
                           "--max_train_steps", "1000"],
        log=ChildLog(progress=_group(r"^step (\d+): loss"), saved=_group(r"^saved state of step (\d+)"),
                     resumed=_group(r"^Resumed from checkpoint: \S+ at step (\d+)")),
        needs=("accelerate",),
    ),
    Stack(
        key="accelerate_epochs", stack="Accelerate, save_state per epoch",
        script="accelerate/test_utils/scripts/external_deps/test_checkpointing.py of the installed accelerate "
               "(a public script, unchanged): save_state to out/epoch_<e>",
        save_interval=EPOCH_STEPS, max_steps=EPOCHS * EPOCH_STEPS, checkpoint_dir="out",
        resume_arg="--resume_from_checkpoint {path}", path_is="the epoch_<e> directory",
        command=lambda w: [PY, accelerate_checkpointing_script(), "--model_name_or_path", "model",
                           "--output_dir", "out", "--num_epochs", str(EPOCHS)],
        log=ChildLog(progress=_epoch_line_step, saved=_epoch_line_step, resumed=_resumed_step),
        needs=("accelerate", "datasets", "evaluate", "transformers"),
        trains_after_resume=False, between_saves=_epoch_save_settled,
    ),
    Stack(
        key="lightning", stack="Lightning",
        script="tests/realworld/scripts/lightning_style.py: every_n_train_steps, epoch=E-step=S.ckpt + last.ckpt",
        save_interval=20, max_steps=200, checkpoint_dir="out/checkpoints", resume_arg="--ckpt_path {path}",
        path_is="the .ckpt file",
        command=lambda w: [PY, str(SCRIPTS / "lightning_style.py"), "--max_steps", "200",
                           "--every_n_train_steps", "20"],
        log=ChildLog(progress=_lightning_step, saved=_group(r"global step (\d+): .*saving model to"),
                     resumed=_group(r"Restoring states from the checkpoint path at \S*step=(\d+)\.ckpt")),
        needs=("lightning",),
    ),
    Stack(
        key="litgpt", stack="Lightning Fabric: litgpt pretrain",
        script="litgpt's pretrain.py of the installed litgpt (a public script, unchanged), run as `python -m litgpt "
               "pretrain`: fabric.save to out/pretrain/step-<8 digits>/lit_model.pth",
        save_interval=20, max_steps=200, checkpoint_dir="out/pretrain", resume_arg="--resume {path}/lit_model.pth",
        path_is="the step-<8 digits> directory (litgpt takes the file in it)",
        command=lambda w: pretrain_command(PY, save_interval=20, steps=200),
        log=ChildLog(progress=_group(r"^Epoch \d+ \| iter \d+ step (\d+) \|"),
                     saved=_group(r"^Saving checkpoint to '\S*step-0*(\d+)/lit_model.pth'"),
                     resumed=_group(r"^Resuming training from \S*step-0*(\d+)/lit_model.pth"),
                     save_announced_before_write=True),
        needs=("litgpt", "litdata"),
    ),
    Stack(
        key="torchtune", stack="plain PyTorch: torchtune full finetune",
        script="torchtune's recipes/full_finetune_single_device.py of the installed torchtune (a public script, "
               "unchanged), run as `tune run full_finetune_single_device`: out/epoch_<e>/ + out/recipe_state/",
        save_interval=TUNE_EPOCH_STEPS, max_steps=TUNE_EPOCHS * TUNE_EPOCH_STEPS, checkpoint_dir="out",
        resume_arg=f"resume_from_checkpoint=True checkpointer.checkpoint_files=[{{path}}/{CHECKPOINT_FILE}]",
        path_is="the epoch_<e> directory (torchtune takes the weights in it, and its own out/recipe_state/)",
        command=lambda w: finetune_command(PY),
        # Its metric logger prints "Step N | loss:..." on stdout, as one print per field ("Step N | " first);
        # its tqdm bar ("2|11|Loss: ...") on stderr may stand before it on the same line of the attempt log,
        # or between "Step N | " and "loss:" (seen under load: the last step's line was cut in two that way).
        log=ChildLog(progress=_group(r"Step (\d+) \| "),
                     saved=_tune_epoch_step(r"Model checkpoint of size .* saved to \S*epoch_(\d+)/"),
                     resumed=_tune_epoch_step(r"checkpoint_paths: \['\S*epoch_(\d+)/"),
                     save_announced_before_write=True),  # out/recipe_state/recipe_state.pt is written after it
        needs=(),  # torchtune lives in torchtune_setup.SITE, outside this interpreter's path: require() checks it
    ),
    Stack(
        key="mace", stack="plain PyTorch: MACE's training command line",
        script="MACE's mace/cli/run_train.py of the installed mace-torch (a public script, unchanged), run as "
               "`python -m mace.cli.run_train`: checkpoints/<name>_run-<seed>_epoch-<N>.pt after every epoch",
        save_interval=1, max_steps=MACE_EPOCHS - 1, checkpoint_dir=MACE_CHECKPOINT_DIR,
        resume_arg="--restart_latest", path_is="not used: MACE loads its newest checkpoint itself",
        command=lambda w: mace_train_command(PY),
        # The epoch line comes just before the save of that epoch; the fault is placed only once that save's
        # file is whole (between_saves), so the newest epoch line read then names a finished save.
        log=ChildLog(progress=_group(MACE_EPOCH_LINE), saved=_group(MACE_EPOCH_LINE),
                     resumed=_group(r"Loading checkpoint: \S*_epoch-(\d+)\.pt")),
        needs=(),  # mace-torch lives in mace_setup.SITE, outside this interpreter's path: require() checks it
        between_saves=_mace_save_whole, step_regex=MACE_EPOCH_LINE,
    ),
    Stack(
        key="deepspeed", stack="DeepSpeed (ZeRO 1, `torchrun`)",
        script="tests/realworld/scripts/deepspeed_style.py: save_checkpoint, global_stepN/ + latest",
        save_interval=20, max_steps=400, checkpoint_dir="out/checkpoints", resume_arg="--load {path}",
        path_is="the global_stepN directory",
        command=lambda w: [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
                           str(SCRIPTS / "deepspeed_style.py"), "--save_interval", "20", "--train_iters", "400"],
        log=ChildLog(progress=_group(r"^iteration (\d+)/"), saved=_group(r"^saved checkpoint at iteration (\d+)"),
                     resumed=_group(r"^resumed from \S+ at iteration (\d+)")),
        needs=("deepspeed",),
    ),
)
