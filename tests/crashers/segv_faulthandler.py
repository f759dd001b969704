"""faulthandler enabled, then a NULL dereference: the real 'Fatal Python error: Segmentation fault' dump."""
import ctypes
import faulthandler

faulthandler.enable()
for step in range(1, 6):
    print(f"global_step={step}", flush=True)


def read_native_chunk() -> bytes:
    return ctypes.string_at(0)


read_native_chunk()
