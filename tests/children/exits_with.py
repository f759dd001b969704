"""A training that reports a few steps, then exits with the status given on its command line
(``usage`` first prints an argparse-style usage error, as a script given a bad flag does)."""

import sys

code = int(sys.argv[1])
if len(sys.argv) > 2 and sys.argv[2] == "usage":
    print("usage: train.py [-h] [--lr LR]", file=sys.stderr)
    print("train.py: error: unrecognized arguments: --bogus", file=sys.stderr)
    sys.exit(code)
for step in range(1, 4):
    print(f"step {step} loss 1.0", flush=True)
sys.exit(code)
