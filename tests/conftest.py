"""Shared pytest set-up. Fixtures a single module needs live in that module or in tests/helpers/."""
from __future__ import annotations

import dataclasses
import re

import pytest

# The API clients anon, r1 and r2 (each needs the module's own ``live`` fixture, made by
# live_api.live_server). Registered here, not imported into each module, so a test's
# parameter does not shadow an imported name.
pytest_plugins = ["tests.helpers.live_api"]

# What a test of another feature's daemon confirms: claimed new bests on GPU lanes only, as
# before first records and the CPU lane were confirmed beside the reference. Otherwise every
# first record these tests report would go back to the queue for a second run. The defaults
# of kz_daemon.config.settings are pinned so for a daemon in this process and for the kz.yaml
# init_state_dir writes; a kz.yaml's own confirmation: section still wins. Tests of the
# confirmation itself are marked ``confirmation_defaults`` and see the shipped defaults.
PINNED_CONFIRMATION = {"cpu_margin": 0.0, "first_records": False}
_SHIPPED_YAML: list[str] = []  # the default kz.yaml text as shipped, kept when the session pins it


def _confirmation_defaults(pinned: dict) -> tuple[tuple, str]:
    """ConfirmationSettings.__init__'s defaults and the default kz.yaml text with ``pinned`` in them."""
    from kz_daemon.config import settings

    names = [f.name for f in dataclasses.fields(settings.ConfirmationSettings)]
    defaults = {f.name: f.default for f in dataclasses.fields(settings.ConfirmationSettings)}
    defaults.update(pinned)
    text = settings.DEFAULT_YAML
    for key, value in pinned.items():
        shown = str(value).lower() if isinstance(value, bool) else f"{value:g}"
        text = re.sub(rf"^(  {key}: )\S+", rf"\g<1>{shown}", text, count=1, flags=re.M)
    return tuple(defaults[n] for n in names), text


@pytest.fixture(scope="session", autouse=True)
def _pinned_confirmation():
    # session-wide, so a daemon a module-scoped fixture starts is pinned too
    from kz_daemon.config import settings

    _SHIPPED_YAML.append(settings.DEFAULT_YAML)
    with pytest.MonkeyPatch.context() as mp:
        init_defaults, text = _confirmation_defaults(PINNED_CONFIRMATION)
        mp.setattr(settings.ConfirmationSettings.__init__, "__defaults__", init_defaults)
        mp.setattr(settings, "DEFAULT_YAML", text)
        yield


@pytest.fixture(autouse=True)
def _shipped_confirmation(request, monkeypatch):
    """A test marked ``confirmation_defaults`` sees the shipped defaults again."""
    if not request.node.get_closest_marker("confirmation_defaults"):
        return
    from kz_daemon.config import settings

    shipped = tuple(f.default for f in dataclasses.fields(settings.ConfirmationSettings))
    monkeypatch.setattr(settings.ConfirmationSettings.__init__, "__defaults__", shipped)
    monkeypatch.setattr(settings, "DEFAULT_YAML", _SHIPPED_YAML[0])


def _gpu_reason() -> str | None:
    """None when CuPy sees a device, else the reason GPU tests are skipped."""
    try:
        import cupy  # noqa: F401
    except Exception as exc:  # ImportError, or a CUDA/ROCm library that fails to load
        return f"CuPy is not importable ({type(exc).__name__}: {exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return f"CuPy finds no GPU device ({type(exc).__name__})"
    return None if count > 0 else "CuPy finds no GPU device"


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if "gpu" in item.keywords:
            if reason is None:
                reason = _gpu_reason() or ""
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"GPU test skipped: {reason}"))
