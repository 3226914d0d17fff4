"""Settings as the running agent holds them: checked once by this package's models, then kept
as plain read-only values that answer to the same names (fields, methods, ``model_dump``,
``model_copy``, ``model_fields_set``). Pure, and free of pydantic: the process that drives a
line never imports it (with APScheduler gone too, its memory went from 46 to 34 MB: see
docs/figures.md).

The models take their methods from the mixins here, so that a method is written once and a
model and its running values behave alike. ``as_running`` turns a validated model (and
everything in it: sections, devices, the line they make up, secrets) into values;
``Values`` pickle, which is how the validating process hands them to the one that runs.

Annotations elsewhere name the models (``AgentSettings``): the values have their fields and
methods by construction.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from pathlib import PurePath
from typing import TYPE_CHECKING, Any, Literal, Self

from agent.config.client_id import default_client_id

if TYPE_CHECKING:
    from agent.config.line import Line, LineDevice
    from agent.controller.profile import Profile

MASK = "**********"
"""What a secret shows as, as pydantic's SecretStr does."""


class Secret:
    """A secret's value, shown masked in every repr, str and dump."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret('{MASK}')"

    def __str__(self) -> str:
        return MASK

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __getstate__(self) -> str:
        return self._value

    def __setstate__(self, state: str) -> None:
        self._value = state


class Values:
    """A validated model's fields (and private attributes), read-only."""

    _field_names: tuple[str, ...]
    _fields_set: frozenset[str]
    _private: tuple[str, ...]

    def __init__(
        self,
        fields: Mapping[str, Any],
        fields_set: frozenset[str] = frozenset(),
        private: Mapping[str, Any] | None = None,
    ) -> None:
        own = self.__dict__
        own.update(fields)
        own.update(private or {})
        own["_field_names"] = tuple(fields)
        own["_fields_set"] = frozenset(fields_set)
        own["_private"] = tuple(private or ())

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__}.{name}: running settings are read-only")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__}.{name}: running settings are read-only")

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild,
            (
                type(self),
                {name: self.__dict__[name] for name in self._field_names},
                self._fields_set,
                {name: self.__dict__[name] for name in self._private},
            ),
        )

    @property
    def model_fields_set(self) -> frozenset[str]:
        """The fields given, not defaulted (as pydantic's)."""
        return self._fields_set

    def model_dump(
        self,
        *,
        mode: Literal["python", "json"] = "python",
        exclude: set[str] | None = None,
        exclude_none: bool = False,
    ) -> dict[str, Any]:
        """The fields as data, nested values as dicts, as pydantic's: in ``json`` mode paths
        are strings and secrets masked."""
        dumped = {}
        for name in self._field_names:
            value = self.__dict__[name]
            if (exclude and name in exclude) or (exclude_none and value is None):
                continue
            dumped[name] = _dump(value, mode, exclude_none)
        return dumped

    def model_copy(self, *, update: Mapping[str, Any] | None = None) -> Self:
        """A copy with some fields (or private attributes, `_line`) replaced."""
        update = dict(update or {})
        unknown = sorted(set(update) - set(self._field_names) - {n for n in update if n[0] == "_"})
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {', '.join(unknown)}")
        own = self.__dict__
        fields = {name: update.get(name, own[name]) for name in self._field_names}
        private = {name: own[name] for name in self._private}
        private |= {name: value for name, value in update.items() if name[0] == "_"}
        return type(self)(fields, self._fields_set | (set(update) & set(fields)), private)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={self.__dict__[name]!r}" for name in self._field_names)
        return f"{type(self).__name__}({shown})"


def _rebuild(
    cls: type[Values], fields: dict[str, Any], fields_set: frozenset[str], private: dict[str, Any]
) -> Values:
    return cls(fields, fields_set, private)


def _dump(value: object, mode: str, exclude_none: bool) -> object:
    if isinstance(value, Values):
        return value.model_dump(mode=mode, exclude_none=exclude_none)  # type: ignore[arg-type]
    if isinstance(value, list | tuple):
        items = [_dump(item, mode, exclude_none) for item in value]
        return items if mode == "json" or isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {key: _dump(item, mode, exclude_none) for key, item in value.items()}
    if mode == "json":
        if isinstance(value, Secret):
            return MASK
        if isinstance(value, PurePath):
            return str(value)
        if isinstance(value, enum.Enum):
            return value.value
    return value


# --------------------------------------------------------------------------- the methods


class DeviceMixin:
    if TYPE_CHECKING:
        _profile: Profile | None

    @property
    def resolved_profile(self) -> Profile | None:
        """Its profile as the line's settings resolved it (None: the set point alone)."""
        return self._profile


class KeysMixin:
    if TYPE_CHECKING:
        point: str
        lock: str

    def of(self, name: str, *, device: str, line: str) -> str:
        template: str = getattr(self, name)
        return template.format(device=device, line=line)

    def of_point(self, point: str, *, device: str, line: str) -> str:
        """A point's key: the set point's own (keys.setpoint), the others by keys.point."""
        if point == "setPoint":
            return self.of("setpoint", device=device, line=line)
        return self.point.format(device=device, line=line, point=point)

    def of_line(self, name: str, line: str) -> str:
        """A line's key: `lock`, `paused`, `switchover` or `history` ({device} is the line's
        id too, as for a single device that is its own line)."""
        return self.of(name, device=line, line=line)


class HealthMixin:
    if TYPE_CHECKING:
        topic: str
        device_topic: str
        availability_topic: str

    def instance_topic(self, line: str, instance: str) -> str:
        return self.topic.format(line=line, instance=instance, device=line)

    def device_status_topic(self, device: str, line: str) -> str:
        return self.device_topic.format(device=device, line=line, instance="")

    def device_availability_topic(self, device: str, line: str) -> str:
        return self.availability_topic.format(device=device, line=line, instance="")


class AgentMixin:
    if TYPE_CHECKING:
        _line: Line | None
        instance_id: str
        keys: KeysMixin
        mqtt: Any  # the sections' fields: agent.config.mqtt and agent.config.telemetry
        telemetry: Any

    @property
    def line(self) -> Line:
        assert self._line is not None
        return self._line

    def profile_for(self, device: LineDevice | str) -> Profile | None:
        """A device's profile, resolved for this line's driver (None: the set point alone)."""
        if isinstance(device, str):
            return self.line.profile(device)
        return device.resolved_profile

    @property
    def client_id(self) -> str:
        return self.mqtt.client_id or default_client_id(self.line.id, self.instance_id)

    @property
    def lock_key(self) -> str:
        return self.keys.lock.format(line=self.line.id, device=self.line.id)

    def key(self, name: str, device: str) -> str:
        """A device's key: `setpoint`, `synced` or `line`."""
        return self.keys.of(name, device=device, line=self.line.id)

    def point_key(self, point: str, device: str) -> str:
        """A point's key: `<device>\\setPoint`, `<device>\\mode`, ..."""
        return self.keys.of_point(point, device=device, line=self.line.id)

    @property
    def telemetry_line_topic(self) -> str:
        template: str = self.telemetry.line_topic
        return template.format(line=self.line.id, device=self.line.id)

    def telemetry_topic(self, device: str) -> str:
        template: str = self.telemetry.topic
        return template.format(device=device, line=self.line.id)


class RunningDevice(DeviceMixin, Values):
    pass


class RunningKeys(KeysMixin, Values):
    pass


class RunningHealth(HealthMixin, Values):
    pass


class RunningSettings(AgentMixin, Values):
    pass


_RUNNING: dict[type, type[Values]] = {
    DeviceMixin: RunningDevice,
    KeysMixin: RunningKeys,
    HealthMixin: RunningHealth,
    AgentMixin: RunningSettings,
}


# --------------------------------------------------------------------------- conversion


def as_running(settings: Any) -> Any:
    """A validated model as running values (values as they are). Typed as what it is given:
    the values answer to the model's names."""
    return _running(settings, {})


def _running(value: Any, seen: dict[int, Any]) -> Any:
    if isinstance(value, Values | str | int | float | bool | PurePath | None):
        return value
    known = seen.get(id(value))
    if known is not None:
        return known
    kind = type(value)
    if hasattr(kind, "model_fields") and hasattr(value, "__pydantic_private__"):
        fields = {name: _running(getattr(value, name), seen) for name in kind.model_fields}
        private = {
            name: _running(item, seen) for name, item in (value.__pydantic_private__ or {}).items()
        }
        cls = next((_RUNNING[base] for base in kind.__mro__ if base in _RUNNING), Values)
        converted: Any = cls(fields, frozenset(value.model_fields_set), private)
    elif hasattr(value, "get_secret_value") and not isinstance(value, Secret):
        converted = Secret(value.get_secret_value())
    elif isinstance(value, list):
        converted = [_running(item, seen) for item in value]
    elif isinstance(value, tuple):
        converted = tuple(_running(item, seen) for item in value)
    elif isinstance(value, dict):
        converted = {key: _running(item, seen) for key, item in value.items()}
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        changed = {}
        for field in dataclasses.fields(value):
            if not field.init:
                continue
            before = getattr(value, field.name)
            after = _running(before, seen)
            if after is not before:
                changed[field.name] = after
        converted = dataclasses.replace(value, **changed) if changed else value
    else:
        converted = value
    seen[id(value)] = converted
    return converted
