"""Real checkpoints for the checkpoint tests, written by CPU torch (and by hand where the format is
simple: safetensors), plus the damage real runs inflict on them (truncation, zero-filled tails,
holes, missing shards, hostile pickles)."""

from __future__ import annotations

import json
import os
import struct
import sys
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# The checkpoint commands on their own (independent of the other command families) ...
SUPERVISE = [sys.executable, "-c",
             ("import click; from supervisor.cli.checkpoint_cmds import register\n"
              "group = click.Group('supervise'); register(group); group()")]
# ... and the real console entry point.
SUPERVISE_MAIN = [sys.executable, "-c", "from supervisor.cli import main; main()"]


# ---------------------------------------------------------------------------- objects


def model_state(seed: int = 0, width: int = 8) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "layer.weight": torch.randn(width, width, generator=gen),
        "layer.bias": torch.randn(width, generator=gen),
        "head.weight": torch.randn(2, width, generator=gen).to(torch.bfloat16),
    }


def lightning_checkpoint(step: int, epoch: int = 0, width: int = 8) -> dict[str, Any]:
    """The shape of a Lightning checkpoint: global_step/epoch next to state_dict and optimizer."""
    state = model_state(step, width)
    return {
        "epoch": epoch,
        "global_step": step,
        "pytorch-lightning_version": "2.6.0",
        "state_dict": state,
        "optimizer_states": [{"state": {0: {"step": torch.tensor(float(step)),
                                            "exp_avg": torch.zeros(width, width)}},
                              "param_groups": [{"lr": 1e-3, "params": [0, 1, 2]}]}],
        "lr_schedulers": [],
        "loops": {"fit_loop": {"epoch_progress": {"current": {"completed": epoch}}}},
        "hyper_parameters": {"lr": 1e-3, "name": "tiny"},
    }


# ---------------------------------------------------------------------------- single files


def save_zip(path: str | os.PathLike[str], step: int, **kw: Any) -> Path:
    path = Path(path)
    torch.save(lightning_checkpoint(step, **kw), path)
    return path


def save_legacy(path: str | os.PathLike[str], step: int) -> Path:
    path = Path(path)
    torch.save(lightning_checkpoint(step), path, _use_new_zipfile_serialization=False)
    return path


def save_without_crc(path: str | os.PathLike[str], step: int) -> Path:
    """torch.save with compute_crc32=False: every CRC field is 0 (valid file, content unverifiable)."""
    from torch.utils.serialization import config

    path = Path(path)
    old = config.save.compute_crc32
    config.save.compute_crc32 = False
    try:
        torch.save(lightning_checkpoint(step), path)
    finally:
        config.save.compute_crc32 = old
    return path


_ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64",
              torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL", torch.float64: "F64"}


def save_safetensors(path: str | os.PathLike[str], tensors: dict[str, torch.Tensor],
                     metadata: dict[str, str] | None = None) -> Path:
    """The safetensors format by hand: u64 header length, JSON header (space-padded to 8), data."""
    path = Path(path)
    header: dict[str, Any] = {}
    blobs = []
    offset = 0
    for name, tensor in tensors.items():
        data = tensor.contiguous().flatten().view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": _ST_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = metadata
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))
    return path


def save_dcp(directory: str | os.PathLike[str], step: int) -> Path:
    """torch.distributed.checkpoint.save without a process group (single process)."""
    import torch.distributed.checkpoint as dcp

    directory = Path(directory)
    state = {"model": model_state(step), "step": step, "optim": {"lr": torch.tensor(0.1)}}
    with warnings.catch_warnings():  # "torch.distributed is disabled ... single process": intended
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state, checkpoint_id=str(directory))
    return directory


# ---------------------------------------------------------------------------- DeepSpeed / Lightning / HF


def make_deepspeed_tag(save_dir: str | os.PathLike[str], step: int, dp: int = 2, mp: int = 1,
                       zero_stage: int = 2, tag: str | None = None, write_latest: bool = True,
                       client_state: dict[str, Any] | None = None) -> Path:
    """A DeepSpeed ``save_checkpoint`` layout written with torch.save: ``latest`` + tag dir with
    ``mp_rank_XX_model_states.pt`` and one ``zero_pp_rank_R_mp_rank_XX_optim_states.pt`` per dp rank."""
    save_dir = Path(save_dir)
    tag = tag or f"global_step{step}"
    tag_dir = save_dir / tag
    tag_dir.mkdir(parents=True, exist_ok=True)
    ds_config = {"train_batch_size": 8, "zero_optimization": {"stage": zero_stage}}
    for m in range(mp):
        states = {
            "module": model_state(step + m), "buffer_names": [], "optimizer": None,
            "param_shapes": [{"layer.weight": torch.Size([8, 8])}], "lr_scheduler": None,
            "sparse_tensor_module_names": set(), "skipped_steps": 0, "global_steps": step,
            "global_samples": step * 8, "dp_world_size": dp, "mp_world_size": mp,
            "ds_config": ds_config, "ds_version": "0.16.4",
        }
        states.update(client_state or {})
        torch.save(states, tag_dir / f"mp_rank_{m:02d}_model_states.pt")
        for d in range(dp):
            optim = {"optimizer_state_dict": {"zero_stage": zero_stage, "partition_count": [dp],
                                              "single_partition_of_fp32_groups": [torch.randn(40)],
                                              "base_optimizer_state": {"state": {}}},
                     "ds_config": ds_config, "ds_version": "0.16.4"}
            torch.save(optim, tag_dir / f"zero_pp_rank_{d}_mp_rank_{m:02d}_optim_states.pt")
    if write_latest:
        (save_dir / "latest").write_text(tag)
    return tag_dir


def make_lightning_deepspeed(path: str | os.PathLike[str], step: int, dp: int = 2) -> Path:
    """Lightning's DeepSpeed strategy: ``<name>.ckpt/`` holding a DeepSpeed dir with tag ``checkpoint``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    make_deepspeed_tag(path, step, dp=dp, tag="checkpoint",
                       client_state={"epoch": 0, "global_step": step, "pytorch-lightning_version": "2.6.0"})
    (path / "zero_to_fp32.py").write_text("# recovery script\n")
    return path


def make_hf_checkpoint(output_dir: str | os.PathLike[str], step: int, *, sharded: bool = False,
                       optimizer: bool = True, world_size: int = 1) -> Path:
    """HF Trainer ``checkpoint-N/`` in write order, ``trainer_state.json`` last."""
    ckpt = Path(output_dir) / f"checkpoint-{step}"
    ckpt.mkdir(parents=True, exist_ok=True)
    state = model_state(step)
    if sharded:
        names = list(state)
        weight_map = {}
        for i, group in enumerate((names[:1], names[1:]), start=1):
            shard = f"model-{i:05d}-of-00002.safetensors"
            save_safetensors(ckpt / shard, {n: state[n] for n in group})
            weight_map.update({n: shard for n in group})
        (ckpt / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    else:
        save_safetensors(ckpt / "model.safetensors", state, {"format": "pt"})
    (ckpt / "config.json").write_text(json.dumps({"model_type": "tiny"}))
    torch.save({"output_dir": str(output_dir), "learning_rate": 1e-3}, ckpt / "training_args.bin")
    if optimizer:
        torch.save({"state": {0: {"step": torch.tensor(float(step)), "exp_avg": torch.zeros(8, 8)}},
                    "param_groups": [{"lr": 1e-3, "params": [0]}]}, ckpt / "optimizer.pt")
        torch.save({"last_epoch": step, "_step_count": step + 1}, ckpt / "scheduler.pt")
    if world_size > 1:
        for rank in range(world_size):
            torch.save({"python": 1, "cpu": torch.zeros(4, dtype=torch.uint8)}, ckpt / f"rng_state_{rank}.pth")
    else:
        torch.save({"python": 1, "cpu": torch.zeros(4, dtype=torch.uint8)}, ckpt / "rng_state.pth")
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": 1.0, "log_history": []}))
    return ckpt


# ---------------------------------------------------------------------------- damage


def truncate(path: str | os.PathLike[str], size: int) -> None:
    os.truncate(path, size)


def zero_range(path: str | os.PathLike[str], offset: int, length: int) -> None:
    """Zero bytes in place, size kept (delayed allocation, writeback holes)."""
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(b"\0" * length)


def zero_tail(path: str | os.PathLike[str], length: int) -> None:
    size = os.path.getsize(path)
    zero_range(path, max(size - length, 0), min(length, size))


def tensor_payload_span(path: str | os.PathLike[str], record: str = "data/0") -> tuple[int, int]:
    """(offset, length) of a tensor record's bytes inside a torch zip (local header parsed)."""
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith("/" + record))
    with open(path, "rb") as handle:
        handle.seek(info.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", handle.read(4))
    return info.header_offset + 30 + name_len + extra_len, info.file_size


def set_mtime(path: str | os.PathLike[str], when: float) -> None:
    os.utime(path, (when, when), follow_symlinks=False)


# ---------------------------------------------------------------------------- hostile pickles


@dataclass
class PlainConfig:
    """A training's own config dataclass: outside the allowlist, constructing it runs no code."""

    lr: float = 0.1
    name: str = "run"


class CreatesFile:
    """Unpickling this creates ``marker`` (it reduces to ``open(marker, 'w')``)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (open, (self.marker, "w"))


class RunsShell:
    """Unpickling this runs ``touch marker`` through os.system."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def save_hostile(path: str | os.PathLike[str], marker: str | os.PathLike[str], step: int = 5,
                 legacy: bool = False) -> Path:
    """A torch checkpoint whose pickle would create ``marker`` if anything unpickled it."""
    path = Path(path)
    obj = {"global_step": step, "state_dict": model_state(step),
           "payload": CreatesFile(str(marker)), "shell": RunsShell(str(marker))}
    torch.save(obj, path, _use_new_zipfile_serialization=not legacy)
    return path


# ---------------------------------------------------------------------------- crafted pickles and zips
#
# Raw pickle bytes (never produced by unpickling anything) for the scanner's hostile-input tests,
# and torch.save-layout zips around them (torch's own PyTorchFileWriter: 64-byte aligned records,
# ZIP64 trailer), so the only thing wrong with the file is the pickle.


def pickle_stack_global(module: str, name: str, arg: str = "true") -> bytes:
    """Protocol 4: ``module``/``name`` via STACK_GLOBAL (a dotted name allowed), called with one
    string argument."""
    def short(text: str) -> bytes:
        raw = text.encode()
        return b"\x8c" + bytes([len(raw)]) + raw

    return b"\x80\x04" + short(module) + short(name) + b"\x93" + short(arg) + b"\x85R."


def pickle_global_call(module: str, name: str, *args: str) -> bytes:
    """Protocol 2: GLOBAL ``module name`` called with string arguments."""
    body = b"".join(b"X" + struct.pack("<I", len(a.encode())) + a.encode() for a in args)
    return b"\x80\x02c" + module.encode() + b"\n" + name.encode() + b"\n(" + body + b"tR."


def pickle_dict(**items: int) -> bytes:
    """Protocol 2: a plain {str: int} dict (what a benign checkpoint's top level looks like)."""
    body = b"".join(b"X" + struct.pack("<I", len(k)) + k.encode() + b"J" + struct.pack("<i", v) for k, v in items.items())
    return b"\x80\x02}(" + body + b"u."


def pickle_nested_tuple_key(depth: int) -> bytes:
    """{(((...),),): 1} with ``depth`` levels: hashing that key recurses ``depth`` deep in C."""
    return b"\x80\x02}(" + b")" + b"\x85" * depth + b"K\x01u."


def pickle_many_ops(count: int) -> bytes:
    """A valid pickle of ``count`` NONE/POP pairs: cheap to write, ``2 * count`` opcodes to walk."""
    return b"\x80\x02" + b"N0" * count + b"N."


def torch_zip_with_pickle(path: str | os.PathLike[str], pkl: bytes,
                          records: dict[str, bytes] | None = None) -> Path:
    """A file in torch.save's exact zip layout whose data.pkl is ``pkl`` (plus ``records``,
    e.g. ``{"data/0": raw bytes}``)."""
    path = Path(path)
    writer = torch._C.PyTorchFileWriter(str(path))
    writer.write_record("data.pkl", pkl, len(pkl))
    for name, data in (("byteorder", b"little"), *(records or {}).items()):
        writer.write_record(name, data, len(data))
    writer.write_record(".format_version", b"1", 1)
    writer.write_record(".storage_alignment", b"64", 2)
    writer.write_end_of_file()
    return path


def data_pkl_of(path: str | os.PathLike[str]) -> bytes:
    with zipfile.ZipFile(path) as archive:
        return archive.read(next(n for n in archive.namelist() if n.endswith("/data.pkl")))


def with_data_pkl(src: str | os.PathLike[str], dst: str | os.PathLike[str], pkl: bytes) -> Path:
    """A copy of the real torch.save file ``src`` (all its tensor records) with data.pkl replaced."""
    with zipfile.ZipFile(src) as archive:
        prefix = archive.namelist()[0].split("/", 1)[0] + "/"
        records = {n[len(prefix):]: archive.read(n) for n in archive.namelist()
                   if n.startswith(prefix + "data/")}
    return torch_zip_with_pickle(dst, pkl, records)


def deflate_bomb_zip(path: str | os.PathLike[str], inflated_mb: int = 300, size_field: int | None = None) -> Path:
    """A torch-style zip whose data.pkl is deflated: ~``inflated_mb`` MB of opcodes in a small
    file. ``size_field`` overwrites the uncompressed size recorded in the central directory
    (a lying header)."""
    path = Path(path)
    pkl = pickle_many_ops((inflated_mb << 20) // 2)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        archive.writestr("archive/data.pkl", pkl)
        archive.writestr(zipfile.ZipInfo("archive/.format_version"), b"1")
        archive.writestr(zipfile.ZipInfo("archive/version"), b"3\n")  # torch refuses an archive without one
    if size_field is not None:
        raw = bytearray(path.read_bytes())
        cd = struct.unpack_from("<I", raw, len(raw) - 6)[0]  # the central directory: data.pkl's entry first
        struct.pack_into("<I", raw, cd + 24, size_field)
        struct.pack_into("<I", raw, 22, size_field)  # and its local header (offset 0): both lie alike
        path.write_bytes(bytes(raw))
    return path
