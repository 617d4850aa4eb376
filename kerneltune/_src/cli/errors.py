"""The one exception the command line turns into `kerneltune: error: <message>`."""


class CommandError(Exception):
    """A failure to report as `kerneltune: error: <message>` with exit status 1."""
