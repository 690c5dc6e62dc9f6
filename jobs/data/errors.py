"""Errors raised while loading data. Each class's docstring is its default message."""

from __future__ import annotations


class DataError(Exception):
    """A data set could not be loaded."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.__doc__)


class DatasetNotFoundError(DataError, FileNotFoundError):
    """The data set's files are not where the config points; copy them there or allow a download."""
