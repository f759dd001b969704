"""``python -m supervisor`` is ``supervise``."""

from .cli import main

if __name__ == "__main__":
    main(prog_name="supervise")
