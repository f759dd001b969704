"""The globals a checkpoint's pickle may name: an allowlist, in this one table.

A pickle names classes and functions (``GLOBAL``/``STACK_GLOBAL``/``INST``) that the loader imports
and calls. With ``torch.load(weights_only=False)`` or ``pickle.load`` any name runs. A file whose
names are all below (or among the user's safe globals) is *trusted*; one naming others is
*untrusted*, which is a note, not damage (see :mod:`.trust`, which also holds the table of hostile
code-execution primitives that do make a file corrupt). The base is exactly the set
PyTorch's weights-only unpickler accepts (``torch/_weights_only_unpickler.py``, torch 2.13,
reproduced here because the supervisor never imports torch); the other groups are what real files
of each supported format hold, each checked to be a plain class, enum or constructor whose
construction from pickled arguments runs no code of the file's choosing.

Names are matched as ``(module, qualified name)`` pairs, exactly as the loader resolves them (after
the Python 2 name mapping that ``pickle`` applies to protocols 0-2). A dotted name is not split:
``("torch.serialization", "os.system")`` is not ``torch.serialization`` and not ``os.system``; it
matches nothing and is refused.
"""

from __future__ import annotations

import _compat_pickle
import contextlib
from collections.abc import Iterable, Iterator
from contextvars import ContextVar


def _names(module: str, names: str) -> tuple[tuple[str, str], ...]:
    return tuple((module, name) for name in names.split())


_TORCH_TENSOR_TYPES = "Double Float Half BFloat16 Long Int Short Char Byte Bool"
_TORCH_STORAGE_TYPES = _TORCH_TENSOR_TYPES + " ComplexDouble ComplexFloat"

# group -> (the file names it applies to, or None for every file; the (module, name) pairs)
SAFE_GLOBAL_GROUPS: dict[str, tuple[frozenset[str] | None, tuple[tuple[str, str], ...]]] = {
    # PyTorch's weights-only unpickler, torch 2.13 (_get_allowed_globals): containers and
    # constructors it needs for state dicts...
    "torch weights-only: basics": (None, (
        ("collections", "OrderedDict"), ("collections", "Counter"),
        ("torch.nn.parameter", "Parameter"), ("torch.serialization", "_get_layout"),
        ("torch", "Size"), ("torch", "Tensor"), ("torch", "device"),
        ("_codecs", "encode"),  # how protocol 2 writes bytes
        ("builtins", "bytearray"), ("builtins", "set"), ("builtins", "complex"),
    )),
    # ...every dtype (torch.storage._dtype_to_storage_type_map, _new_dtypes, uint1-7, int1-7)...
    "torch weights-only: dtypes": (None, _names("torch", """
        float64 float32 float16 bfloat16 int64 int32 int16 int8 uint8 bool complex128 complex64
        complex32 qint8 qint32 quint8 quint4x2 quint2x4 uint16 uint32 uint64 float8_e5m2
        float8_e4m3fn float8_e5m2fnuz float8_e4m3fnuz float8_e8m0fnu float4_e2m1fn_x2 bits8 bits16
        bits1x8 bits2x4 bits4x2 uint1 uint2 uint3 uint4 uint5 uint6 uint7 int1 int2 int3 int4 int5
        int6 int7""")),
    # ...the legacy tensor and storage classes (torch._tensor_classes, torch._storage_classes)...
    "torch weights-only: tensor and storage classes": (None, (
        *_names("torch", " ".join(f"{t}Tensor" for t in _TORCH_TENSOR_TYPES.split())),
        *_names("torch.cuda", " ".join(f"{t}Tensor" for t in _TORCH_TENSOR_TYPES.split())),
        *_names("torch.sparse", " ".join(f"{t}Tensor" for t in _TORCH_TENSOR_TYPES.split() if t != "Bool")),
        *_names("torch.cuda.sparse", " ".join(f"{t}Tensor" for t in _TORCH_TENSOR_TYPES.split() if t != "Bool")),
        *_names("torch", " ".join(f"{t}Storage" for t in _TORCH_STORAGE_TYPES.split())),
        *_names("torch", "QInt8Storage QInt32Storage QUInt8Storage QUInt4x2Storage QUInt2x4Storage"),
        *_names("torch.cuda", " ".join(f"{t}Storage" for t in _TORCH_STORAGE_TYPES.split())),
        ("torch.storage", "TypedStorage"), ("torch.storage", "UntypedStorage"),
    )),
    # ...quantization schemes and the tensor rebuild functions.
    "torch weights-only: quantization and rebuild functions": (None, (
        *_names("torch", """per_tensor_affine per_tensor_symmetric per_channel_affine
                per_channel_symmetric per_channel_affine_float_qparams"""),
        *_names("torch._utils", """_rebuild_parameter _rebuild_parameter_with_state _rebuild_qtensor
                _rebuild_tensor _rebuild_tensor_v2 _rebuild_tensor_v3 _rebuild_sparse_tensor
                _rebuild_meta_tensor_no_storage _rebuild_nested_tensor _rebuild_wrapper_subclass
                _rebuild_device_tensor_from_numpy _rebuild_device_tensor_from_cpu_tensor"""),
        ("torch._tensor", "_rebuild_from_type_v2"),
    )),
    # Types torch itself adds to the weights-only list when torch.distributed.tensor and
    # torch.nested are imported: DTensor/FSDP2 state dicts, nested jagged tensors.
    "torch weights-only: DTensor and nested tensors": (None, (
        ("torch.distributed.device_mesh", "DeviceMesh"), ("torch.distributed.tensor", "DTensor"),
        ("torch.distributed._mesh_layout", "_FlatLayout"), ("torch.distributed._mesh_layout", "_MeshLayout"),
        *_names("torch.distributed.tensor._dtensor_spec", "DTensorSpec ShardOrderEntry TensorMeta"),
        *_names("torch.distributed.tensor.placement_types", "Partial Replicate Shard _StridedShard"),
        *_names("torch.nested._internal.nested_tensor", "NestedTensor _rebuild_njt"),
    )),
    # DCP's .metadata, which torch.distributed.checkpoint reads with plain pickle.load: its
    # dataclasses, the memory-format enum, and the checkpoint_id path it records.
    "torch.distributed.checkpoint metadata": (None, (
        *_names("torch.distributed.checkpoint.metadata", """Metadata MetadataIndex StorageMeta
                TensorStorageMetadata BytesStorageMetadata ChunkStorageMetadata TensorProperties
                _MEM_FORMAT_ENCODING"""),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        *_names("pathlib", "PosixPath WindowsPath PurePosixPath PureWindowsPath"),
    )),
    # numpy scalars (np.int64 steps, np.float32 metrics) and arrays (HF Trainer's rng_state.pth holds
    # numpy's RNG state): the exact set transformers allows for its own weights-only loads, under
    # numpy 2 (numpy._core) and numpy 1 (numpy.core) module names.
    "numpy scalars and arrays": (None, (
        *_names("numpy._core.multiarray", "_reconstruct scalar"),
        *_names("numpy.core.multiarray", "_reconstruct scalar"),
        ("numpy", "ndarray"), ("numpy", "dtype"),
        *_names("numpy.dtypes", """UInt8DType UInt16DType UInt32DType UInt64DType Int8DType Int16DType
                Int32DType Int64DType Float16DType Float32DType Float64DType BoolDType"""),
    )),
    # Lightning's hyper_parameters when they are an OmegaConf DictConfig (Hydra users): the
    # container classes, their metadata, and the plain types OmegaConf records as key/element types.
    "OmegaConf hyper-parameters (Lightning + Hydra)": (None, (
        *_names("omegaconf.dictconfig", "DictConfig"), *_names("omegaconf.listconfig", "ListConfig"),
        *_names("omegaconf.base", "ContainerMetadata Metadata"),
        ("omegaconf.nodes", "AnyNode"),
        ("typing", "Any"), ("collections", "defaultdict"),
        *_names("builtins", "dict list tuple int float str bool bytes"),
    )),
    # Plain training loops: torch.save({'args': argparse.Namespace(...)}) and timestamps.
    "plain training loops": (None, (
        ("argparse", "Namespace"),
        *_names("datetime", "datetime date time timedelta timezone"),
    )),
    # DeepSpeed's optimizer shards: the loss scaler object, the ZeRO stage enum and bf16 fragment
    # addresses (what DeepSpeed users add with torch.serialization.add_safe_globals).
    "DeepSpeed optimizer state": (None, (
        *_names("deepspeed.runtime.fp16.loss_scaler", "LossScaler DynamicLossScaler"),
        ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
        ("deepspeed.utils.tensor_fragment", "fragment_address"),
    )),
    # HF Trainer's training_args.bin (a pickled TrainingArguments, kept for reference; Trainer never
    # loads it on resume), and only that file: TrainingArguments' __init__ sets up devices.
    "HF Trainer training_args.bin": (frozenset({"training_args.bin"}), (
        *_names("transformers.training_args", "TrainingArguments OptimizerNames"),
        ("transformers.training_args_seq2seq", "Seq2SeqTrainingArguments"),
        *_names("transformers.trainer_utils", """IntervalStrategy SaveStrategy HubStrategy SchedulerType
                FSDPOption ShardedDDPOption"""),
        ("transformers.trainer_pt_utils", "AcceleratorConfig"), ("transformers.debug_utils", "DebugOption"),
        ("accelerate.state", "PartialState"), ("accelerate.utils.dataclasses", "DistributedType"),
    )),
}

SAFE_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    pair for scope, pairs in SAFE_GLOBAL_GROUPS.values() if scope is None for pair in pairs)


def safe_globals_for(filename: str = "") -> frozenset[tuple[str, str]]:
    """The allowlist for a file of this base name (the base set plus name-scoped groups)."""
    extra = [pair for scope, pairs in SAFE_GLOBAL_GROUPS.values()
             if scope is not None and filename in scope for pair in pairs]
    return SAFE_GLOBALS.union(extra) if extra else SAFE_GLOBALS


def resolve(module: str, name: str, proto: int) -> tuple[str, str]:
    """The (module, name) the loader imports: pickle maps Python 2 names for protocols < 3."""
    if proto < 3:
        mapped = _compat_pickle.NAME_MAPPING.get((module, name))
        if mapped is not None:
            return mapped
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
    return module, name


def parse_extra(names: Iterable[str]) -> frozenset[tuple[str, str]]:
    """``"pkg.mod:Class"`` (or ``"pkg.mod.Class"``, split at the last dot) -> pairs, for globals a
    user declares safe (their own config dataclasses), like torch's ``add_safe_globals``."""
    out = set()
    for item in names:
        item = item.strip()
        module, sep, name = item.partition(":")
        if not sep:
            module, _, name = item.rpartition(".")
        if module and name:
            out.add((module, name))
    return frozenset(out)


def disallowed(names: Iterable[tuple[str, str]], allowed: frozenset[tuple[str, str]] = SAFE_GLOBALS) -> tuple[str, ...]:
    """The resolved names (``module.name``, sorted) that are not allowed."""
    return tuple(sorted({f"{m}.{n}" for m, n in names if (m, n) not in allowed}))


# Globals the user declared safe for this validation (``extra_safe_globals``), like torch's
# add_safe_globals: a context variable, so concurrent validations do not see each other's.
_EXTRA: ContextVar[frozenset[tuple[str, str]]] = ContextVar("supervisor_extra_safe_globals", default=frozenset())


def allowed_for(filename: str = "") -> frozenset[tuple[str, str]]:
    """The allowlist in force for a file of this base name."""
    extra = _EXTRA.get()
    base = safe_globals_for(filename)
    return base | extra if extra else base


@contextlib.contextmanager
def extra_safe_globals(names: Iterable[str]) -> Iterator[None]:
    """Also accept ``names`` (``"pkg.mod:Class"``) inside this block."""
    pairs = parse_extra(names)
    if not pairs:
        yield
        return
    token = _EXTRA.set(_EXTRA.get() | pairs)
    try:
        yield
    finally:
        _EXTRA.reset(token)
