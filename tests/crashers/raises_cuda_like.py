"""A CUDA error reaches Python as an exception (exit status 1); the message, not the status, decides.

Torch is not needed: the exception class and message are the ones PyTorch raises."""


class AcceleratorError(RuntimeError):
    pass


AcceleratorError.__module__ = "torch"
print("global_step=99", flush=True)
raise AcceleratorError("CUDA error: an illegal memory access was encountered\n"
                       "CUDA kernel errors might be asynchronously reported at some other API call, so the "
                       "stacktrace below might be incorrect.")
