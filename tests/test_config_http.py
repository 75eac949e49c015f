"""The HTTP shim's limits are set in kz.yaml's ``http:`` section and reach the shim's settings."""
from __future__ import annotations

import dataclasses

import pytest

from kz_daemon.api.shim_settings import ShimSettings, from_config
from kz_daemon.config.settings import Config, write_default
from kz_daemon.core.errors import ZooError


def test_http_limits_from_kz_yaml_reach_the_shim(tmp_path):
    (tmp_path / "kz.yaml").write_text(
        "http:\n  submit_rate_per_s: 2\n  submit_burst: 3\n  max_json_bytes: 4096\n"
        "  status_max_wait_s: 5\n  claim_max_wait_s: 7\n  intake_wait_s: 9\n  max_result_bytes: 65536\n")
    settings = from_config(Config.load(tmp_path))
    assert (settings.submit_rate_per_s, settings.submit_burst) == (2.0, 3)
    assert (settings.max_json_bytes, settings.max_result_bytes) == (4096, 65536)
    assert (settings.status_max_wait_s, settings.claim_max_wait_s, settings.intake_wait_s) == (5.0, 7.0, 9.0)


def test_every_http_field_the_shim_shares_and_the_other_sections_reach_it(tmp_path):
    """``from_config`` names each field it reads: a new ``http:`` field sharing a ShimSettings name must be added."""
    config = Config.default(tmp_path)
    http = config.http
    changed: dict[str, object] = {}
    for f in dataclasses.fields(http):
        if f.name in ShimSettings.__dataclass_fields__:
            value = getattr(http, f.name)
            changed[f.name] = ("10.0.0.0/8",) if isinstance(value, tuple) else type(value)(value * 2 + 1)
    assert changed  # the sections share fields
    config = dataclasses.replace(
        config, http=dataclasses.replace(http, **changed),
        limits=dataclasses.replace(config.limits, max_compressed_bytes=12345),
        policy=dataclasses.replace(config.policy, submissions_require_token=True),
        queue=dataclasses.replace(config.queue, lease_seconds=77.0),
        timeouts=dataclasses.replace(config.timeouts, build_s=11.0, benchmark_s=13.0))
    settings = from_config(config)
    assert {name: getattr(settings, name) for name in changed} == changed
    assert (settings.max_upload_bytes, settings.submissions_require_token, settings.lease_seconds,
            settings.build_s, settings.benchmark_s) == (12345, True, 77.0, 11.0, 13.0)
    assert from_config(None) == ShimSettings()


def test_documented_default_file_matches_the_built_in_defaults(tmp_path):
    assert write_default(tmp_path / "kz.yaml")
    assert Config.load(tmp_path).http == Config.default(tmp_path).http


@pytest.mark.parametrize("key", ["submit_burst", "max_json_bytes", "claim_max_wait_s"])
def test_non_positive_http_limits_are_refused(tmp_path, key):
    (tmp_path / "kz.yaml").write_text(f"http:\n  {key}: 0\n")
    with pytest.raises(ZooError) as err:
        Config.load(tmp_path)
    assert err.value.code == "CONFIG_INVALID" and err.value.details.get("key") == f"http.{key}"
