"""kz.yaml: defaults that work, the documented default file, unknown keys and bad values refused."""
from __future__ import annotations

import dataclasses

import pytest
import yaml

from kz_daemon.config.settings import DEFAULT_YAML, Config, write_default
from kz_daemon.core.errors import ZooError


def test_missing_file_gives_defaults(tmp_path):
    config = Config.load(tmp_path)
    assert config.paths.repo == tmp_path.resolve() / "repo"
    assert config.queue.lease_seconds == 300 and config.policy.allow_new_packages is True
    assert config.spool_inbox == tmp_path.resolve() / "spool" / "inbox"


def test_documented_default_file_equals_built_in_defaults(tmp_path):
    assert write_default(tmp_path / "kz.yaml") is True
    assert write_default(tmp_path / "kz.yaml") is False  # never overwritten
    loaded = dataclasses.replace(Config.load(tmp_path), source_file=None)
    assert loaded == Config.default(tmp_path)
    assert yaml.safe_load(DEFAULT_YAML)["queue"]["max_attempts"] == 3


def test_values_and_relative_paths(tmp_path):
    (tmp_path / "kz.yaml").write_text(
        "paths:\n  repo: ../kernels\nqueue:\n  lease_seconds: 30\nmirrors:\n  - {name: b, url: /srv/b.git}\n")
    config = Config.load(tmp_path)
    assert config.paths.repo == (tmp_path / ".." / "kernels").resolve()
    assert config.queue.lease_seconds == 30.0 and isinstance(config.queue.lease_seconds, float)
    assert config.mirrors[0].url == "/srv/b.git"
    assert config.with_paths(repo=tmp_path / "r").paths.repo == tmp_path / "r"


@pytest.mark.parametrize("text,key", [
    ("queue:\n  lease_secs: 10\n", "queue.lease_secs"),
    ("colour: blue\n", "colour"),
    ("paths:\n  inbox: x\n", "paths.inbox"),
    ("mirrors:\n  - {name: a, url: /x, branch: dev}\n", "mirrors[0].branch"),
])
def test_unknown_keys_are_refused_by_name(tmp_path, text, key):
    (tmp_path / "kz.yaml").write_text(text)
    with pytest.raises(ZooError) as info:
        Config.load(tmp_path)
    assert info.value.code == "CONFIG_INVALID" and info.value.details["key"] == key
    assert key in info.value.message and "allowed here" in info.value.message


@pytest.mark.parametrize("text,key", [
    ("queue:\n  max_attempts: three\n", "queue.max_attempts"),
    ("policy:\n  allow_new_packages: 1\n", "policy.allow_new_packages"),
    ("queue:\n  lease_seconds: 0\n", "queue.lease_seconds"),
    ("http:\n  port: 70000\n", "http.port"),
    ("queue: [1, 2]\n", "queue"),
    ("mirrors:\n  - {name: a}\n", "mirrors[0].url"),
])
def test_bad_values_are_refused(tmp_path, text, key):
    (tmp_path / "kz.yaml").write_text(text)
    with pytest.raises(ZooError) as info:
        Config.load(tmp_path)
    assert info.value.details["key"] == key


def test_not_yaml(tmp_path):
    (tmp_path / "kz.yaml").write_text("queue: [unclosed\n")
    with pytest.raises(ZooError) as info:
        Config.load(tmp_path)
    assert "not valid YAML" in info.value.message
