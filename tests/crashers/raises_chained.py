"""A Python exception chained onto its root cause: the root cause is what a person must fix."""
import sys

print("step 3 loss 2.0", flush=True)


def load_labels(row: dict) -> int:
    return {"cat": 0, "dog": 1}[row["label"]]


try:
    load_labels({"label": "tabby"})
except KeyError as exc:
    raise RuntimeError("could not map the label of row 17") from exc
finally:
    sys.stdout.flush()
