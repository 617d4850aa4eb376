"""A progress bar for tuning: shown only on a terminal, and only when tuning takes
more than a moment (tqdm's `delay`), so logs and CI output stay clean."""

from __future__ import annotations

import sys
from typing import Any

#: Seconds before the bar appears; quick tunings never show one.
BAR_DELAY_S = 1.0


class Progress:
    """Counts work units (compiles and timing samples); the total may grow as a search
    strategy asks for more candidates."""

    def __init__(self, desc: str, enabled: bool | None = None) -> None:
        if enabled is None:
            enabled = _stderr_is_terminal()
        self._bar: Any = None
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=0,
                desc=desc[:40] or "tuning",
                unit="step",
                delay=BAR_DELAY_S,
                leave=False,
                file=sys.stderr,
                dynamic_ncols=True,
            )

    def add_total(self, n: int) -> None:
        if self._bar is not None and n:
            self._bar.total += n
            self._bar.refresh()

    def advance(self, n: int = 1, stage: str | None = None) -> None:
        if self._bar is not None:
            if stage is not None:
                self._bar.set_postfix_str(stage, refresh=False)
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
