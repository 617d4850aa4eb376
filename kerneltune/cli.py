"""The `kerneltune` command line (also `python -m kerneltune`); the commands live in
`kerneltune._src.cli`."""

from kerneltune._src.cli.errors import CommandError as CommandError
from kerneltune._src.cli.main import COMMANDS as COMMANDS
from kerneltune._src.cli.main import build_parser as build_parser
from kerneltune._src.cli.main import main as main
