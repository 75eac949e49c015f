"""The HTTP shim's limits are set in kz.yaml's ``http:`` section and reach the shim's settings."""
from __future__ import annotations

import pytest

from kz_daemon.api.shim_settings import from_config
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


def test_documented_default_file_matches_the_built_in_defaults(tmp_path):
    assert write_default(tmp_path / "kz.yaml")
    assert Config.load(tmp_path).http == Config.default(tmp_path).http


@pytest.mark.parametrize("key", ["submit_burst", "max_json_bytes", "claim_max_wait_s"])
def test_non_positive_http_limits_are_refused(tmp_path, key):
    (tmp_path / "kz.yaml").write_text(f"http:\n  {key}: 0\n")
    with pytest.raises(ZooError) as err:
        Config.load(tmp_path)
    assert err.value.code == "CONFIG_INVALID" and err.value.details.get("key") == f"http.{key}"
