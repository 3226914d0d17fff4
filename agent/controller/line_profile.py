"""How a unit speaking the line protocol keeps a profile's points: pure data and pure
functions, shared by the line driver and the simulator's units.

Each point has a name of one or two characters (`SP`, `H`, `RH`): the name of its field in
the reply to `GET POINTS` (`POINTS SP=21.5 H=20.0 C=24.0 M=HEAT F=AUTO O=1 T=21.3 RH=45.0`)
and in `SET <name> <value>` / `OK <name> <value>`. A number is a decimal (`21.5`), a choice
an upper-case token (the value in upper case unless the map says otherwise: `HEAT`), a
switch 1 or 0. Names are short so that a reply of every point stays within a line (80 bytes
with the address prefix and the checksum) and a write is never longer than `SET SP -10.55`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from agent.controller import line_protocol as lp
from agent.controller.interface import PointValue
from agent.controller.points import POINTS, InvalidValue, Kind

__all__ = ["LinePoint", "LineProfile"]

_NAME = re.compile(r"[A-Z][A-Z0-9]?")
_TOKEN = re.compile(r"[A-Z][A-Z0-9]{0,5}")
NUMBER_CHARS = 5
"""The longest number a unit reports, as the reply's length is bounded: `-10.5`, `100.0`,
`21.25`."""
_SWITCH_TEXT = {True: "1", False: "0"}


@dataclass(frozen=True, slots=True)
class LinePoint:
    """One point's name, and a choice's tokens."""

    name: str
    tokens: Mapping[str, str] = field(default_factory=dict)
    """A choice's token for some of its values (the others: the value in upper case)."""


@dataclass(frozen=True, slots=True)
class LineProfile:
    """A profile's points as a unit speaking the line protocol keeps them. ValueError at
    construction, naming the point, for a map that makes no sense: an unknown point, a name
    that is not one or two upper-case characters or is given twice, a token that is not a
    short upper-case word or is given twice, a reply of every point that would not fit a
    line."""

    points: Mapping[str, LinePoint]
    _by_name: dict[str, str] = field(init=False, repr=False, compare=False)
    _tokens: dict[str, dict[str, str]] = field(init=False, repr=False, compare=False)
    _values: dict[str, dict[str, str]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name: dict[str, str] = {}
        tokens: dict[str, dict[str, str]] = {}
        for point_name, spec in self.points.items():
            known = POINTS.get(point_name)
            if known is None:
                raise ValueError(f"point {point_name}: no such point (known: {', '.join(POINTS)})")
            if not _NAME.fullmatch(spec.name):
                raise ValueError(
                    f"point {point_name}: its name {spec.name!r} is not one or two upper-case "
                    "letters or digits, starting with a letter"
                )
            if spec.name in by_name:
                raise ValueError(
                    f"point {point_name}: the name {spec.name} is {by_name[spec.name]}'s too"
                )
            if point_name == "setPoint" and spec.name != "SP":
                raise ValueError(f"point setPoint: its name is SP, not {spec.name}")
            if point_name != "setPoint" and spec.name == "SP":
                raise ValueError(f"point {point_name}: SP is the set point's name")
            by_name[spec.name] = point_name
            if known.kind is Kind.CHOICE:
                tokens[point_name] = _tokens(point_name, known.choices, spec.tokens)
            elif spec.tokens:
                raise ValueError(f"point {point_name}: only a choice has tokens")
        object.__setattr__(self, "_by_name", by_name)
        object.__setattr__(self, "_tokens", tokens)
        object.__setattr__(
            self,
            "_values",
            {
                name: {token: value for value, token in map_.items()}
                for name, map_ in tokens.items()
            },
        )
        longest = self.longest_reply_bytes()
        if longest > lp.MAX_LINE:
            raise ValueError(
                f"the reply to GET POINTS may take {longest} bytes, over the line's "
                f"{lp.MAX_LINE}: use shorter names or tokens, or fewer points"
            )

    def name(self, point: str) -> str:
        """A point's name on the line (KeyError if the map has none)."""
        try:
            return self.points[point].name
        except KeyError:
            raise KeyError(f"the profile's line map has no point {point}") from None

    def point(self, name: str) -> str | None:
        """The point with this name on the line, or None."""
        return self._by_name.get(name)

    @property
    def writable_names(self) -> frozenset[str]:
        """The names `SET <name>` writes (the set point's, SP, among them)."""
        return frozenset(spec.name for p, spec in self.points.items() if POINTS[p].writable)

    def choices(self, point: str) -> tuple[str, ...]:
        return tuple(self._tokens[point])

    def encode(self, point: str, value: PointValue) -> str:
        """A value's text on the line; InvalidValue if the point cannot have it."""
        kind = POINTS[point].kind
        if kind is Kind.NUMBER:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidValue(f"{point} is a number, not {value!r}")
            return lp.format_number(value)
        if kind is Kind.SWITCH:
            if not isinstance(value, bool):
                raise InvalidValue(f"{point} is true or false, not {value!r}")
            return _SWITCH_TEXT[value]
        token = self._tokens[point].get(value) if isinstance(value, str) else None
        if token is None:
            raise InvalidValue(f"{value!r} is not one of {', '.join(self._tokens[point])}")
        return token

    def decode(self, point: str, text: str) -> PointValue:
        """A value from its text on the line; InvalidValue for text that is not one."""
        kind = POINTS[point].kind
        if kind is Kind.NUMBER:
            try:
                return lp.parse_number(text)
            except ValueError as exc:
                raise InvalidValue(f"{point}: {exc}") from None
        if kind is Kind.SWITCH:
            for value, shown in _SWITCH_TEXT.items():
                if text == shown:
                    return value
            raise InvalidValue(f"{point} is 1 or 0, not {text!r}")
        try:
            return self._values[point][text.upper()]
        except KeyError:
            raise InvalidValue(
                f"{point} is one of {', '.join(self._values[point])}, not {text!r}"
            ) from None

    def decode_all(self, fields: Iterable[tuple[str, str]]) -> dict[str, PointValue]:
        """Every point of the map from a POINTS reply's fields (others are ignored);
        InvalidValue for a point missing or not of its kind."""
        texts = dict(fields)
        values: dict[str, PointValue] = {}
        for point, spec in self.points.items():
            text = texts.get(spec.name)
            if text is None:
                raise InvalidValue(f"the reply has no {spec.name} ({point})")
            values[point] = self.decode(point, text)
        return values

    def fields(self, values: Mapping[str, PointValue]) -> tuple[tuple[str, str], ...]:
        """A POINTS reply's fields for the map's points (a unit's own reply)."""
        return tuple(
            (spec.name, self.encode(point, values[point])) for point, spec in self.points.items()
        )

    def longest_reply_bytes(self) -> int:
        """The longest a reply to GET POINTS can be, on a line: `@247 ` prefix, every
        field at its longest (a number of NUMBER_CHARS), the checksum and CR LF."""
        text = len("@247 POINTS")
        for point, spec in self.points.items():
            kind = POINTS[point].kind
            if kind is Kind.NUMBER:
                width = NUMBER_CHARS
            elif kind is Kind.SWITCH:
                width = 1
            else:
                width = max(len(token) for token in self._tokens[point].values())
            text += len(f" {spec.name}=") + width
        return text + len("*HH") + len(lp.TERMINATOR)

    def poll_frame(self) -> tuple[int, int]:
        """Bytes of the block read's request and (longest) reply, addressed."""
        return len(lp.encode_line("@247 GET POINTS")), self.longest_reply_bytes()


def _tokens(point: str, choices: tuple[str, ...], given: Mapping[str, str]) -> dict[str, str]:
    unknown = [value for value in given if value not in choices]
    if unknown:
        raise ValueError(f"point {point}: {unknown[0]!r} is not one of {', '.join(choices)}")
    tokens = {value: given.get(value, value.upper()) for value in choices}
    seen: dict[str, str] = {}
    for value, token in tokens.items():
        if not _TOKEN.fullmatch(token):
            raise ValueError(
                f"point {point}: the token {token!r} of {value} is not an upper-case word of "
                "one to six letters or digits"
            )
        if token in seen:
            raise ValueError(
                f"point {point}: {seen[token]} and {value} both have the token {token}"
            )
        seen[token] = value
    return tokens
