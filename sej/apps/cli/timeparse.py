"""The click parameter type for time arguments (the forms: sej.timestamps)."""

from __future__ import annotations

import click

from ...timestamps import TimeError, parse_time


class TimeType(click.ParamType[int]):
    """A click parameter type for time arguments (see sej.timestamps)."""

    name = "TIME"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return parse_time(str(value))
        except TimeError as e:
            self.fail(str(e), param, ctx)


TIME = TimeType()
