"""`python -m kerneltune`: the same as the `kerneltune` command."""

from kerneltune.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
