"""Killed from outside (as the OOM killer or a KILL after a timeout would): SIGKILL, no output after."""
import os
import signal

print("step 40 loss 0.25", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
