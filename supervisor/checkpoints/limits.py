"""How much of a checkpoint the scanners will read, in one place.

A checkpoint's pickle is untrusted input: a deflate bomb, a pickle of millions of no-op opcodes or
a 200,000-deep tuple must cost the supervisor a bounded amount of time and memory. The caps are far
above what writers produce (a 60,000-tensor torch.save has a 5 MB ``data.pkl`` of 1.8 M opcodes;
CPython's pickler cannot nest deeper than its recursion limit, 1,000 by default), so a file over
one is either crafted or not a checkpoint. Such a file is reported UNVERIFIABLE with "too large to
scan" / "too deeply nested to scan" and is never a resume point (what was not read may name any
global), but it is not quarantined: nothing proved it damaged.
"""

from __future__ import annotations

MAX_PICKLE_BYTES = 64 << 20  # decompressed bytes of one pickle stream (data.pkl, .metadata, a .pkl)
MAX_PICKLE_OPS = 10_000_000  # opcodes processed in one stream, constants included
MAX_NESTING = 1_000  # containers inside containers
MAX_SMALL_CONSTANT = 1 << 20  # str/bytes constants longer than this are checked for bounds, not decoded
MAX_STEP = 10**15 - 1  # a step number has at most 15 ASCII digits; more is not a step
MAX_SHARDS = 1_000_000  # shard files a directory checkpoint may imply (DeepSpeed dp x mp, HF ranks)
MAX_SMALL_FILE = 16 << 20  # JSON sidecars, DeepSpeed 'latest', DCP .metadata read whole
MAX_GLOBALS = 10_000  # different globals one pickle may name (checkpoints name a few dozen)
MAX_STORAGES = 200_000  # different tensor storages one pickle may name (a 60,000-tensor save names 60,000)

# Memory bound of the scan (docs/benchmarks.md, "Pickle scan"): after LEAN_AFTER_OPS opcodes the
# scan keeps only scalars set into mappings and short strings/globals in the memo, LEAN_KEEP of
# them at most; the input itself is read through a mapping whose pages are dropped behind it.
LEAN_AFTER_OPS = 400_000
LEAN_KEEP = 100_000
LEAN_STACK = 1_000_000  # items on the stack at once in lean mode (picklers batch by 1,000 per MARK)


class ScanLimitError(Exception):
    """The input is over one of the caps above; ``reason`` says which ("too large to scan: ...")."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
