"""The ports the daemon's modules and the HTTP layer type the daemon by: ``Zoo`` has every call they name.

mypy checks this where ``serve_config`` hands a ``Zoo`` to ``create_app`` (a ``Service``); this
test says the same without mypy, by name and parameters, so a call added to a port without
its method on ``Zoo`` (or renamed on one side only) fails here too.
"""
from __future__ import annotations

import inspect

import pytest

from kz_daemon.config.ports import Daemon, Service
from kz_daemon.ops.service import Zoo


def _calls(protocol: type) -> dict[str, inspect.Signature]:
    out = {}
    for klass in protocol.__mro__:
        for name, member in vars(klass).items():
            if inspect.isfunction(member) and not name.startswith("_"):
                out.setdefault(name, inspect.signature(member))
    return out


def test_service_extends_the_daemon_port():
    assert Daemon in Service.__mro__ and set(_calls(Daemon)) <= set(_calls(Service))


@pytest.mark.parametrize("name", sorted(_calls(Service)))
def test_zoo_has_every_call_of_the_service_port_with_its_parameters(name):
    wanted = _calls(Service)[name]
    method = getattr(Zoo, name, None)
    assert callable(method), f"Zoo has no {name}"
    got = inspect.signature(method)
    assert list(got.parameters) == list(wanted.parameters), (name, got, wanted)
    for param in wanted.parameters.values():  # the same defaults: a caller may leave out the same ones
        assert got.parameters[param.name].default == param.default, (name, param.name)
    assert inspect.iscoroutinefunction(method) == inspect.iscoroutinefunction(_member(name)), name


def _member(name: str):
    for klass in Service.__mro__:
        if name in vars(klass):
            return vars(klass)[name]
    raise KeyError(name)
