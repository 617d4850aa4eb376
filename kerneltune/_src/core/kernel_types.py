"""Type variables shared by the kernel, selection and tuning modules."""

from typing import TypeVar

Cfg = TypeVar("Cfg")
Out = TypeVar("Out")
