"""The URLs of a model service and of a fleet's replicas: what is refused before any
request, in one line naming the setting (tasks/config/schema.py, focus/backends/foreign.py,
focus/backends/fleet.py). Each of these passed the configuration and failed later: at the
first request as a connection error waited out as an outage, as an AttributeError, or not
at all (one server taken for two replicas; credentials written to logs and records)."""

from __future__ import annotations

import pytest

from focus.backends import FleetPolicy, LlamaCppPolicy, OpenAICompatPolicy, SGLangPolicy
from tasks.config import ConfigError, load_config


def refused(kind: str, urls: object) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(overrides={"model.kind": kind, "model.urls": urls}, environ={})
    line = str(e.value)
    assert "\n" not in line
    return line


@pytest.mark.parametrize("kind", ["openai", "sglang", "llamacpp"])
def test_one_server_listed_twice_in_model_urls_is_refused(kind):
    assert "model.urls lists 'http://a:8000' twice: list each replica once" in refused(
        kind, ["http://a:8000", "http://b:8000", "http://a:8000"]
    )
    line = refused(kind, ["http://gpu0:80/", "http://GPU0"])
    assert "'http://gpu0:80/' and 'http://GPU0', which name one server" in line


def test_v1_names_the_server_root_for_openai_but_not_for_sglang():
    assert "which name one server" in refused("openai", ["http://a:8000", "http://a:8000/v1/"])
    config = load_config(overrides={"model.kind": "sglang", "model.urls": ["http://a:8000", "http://a:8000/v1"]})
    assert config.model.urls == ["http://a:8000", "http://a:8000/v1"]  # another path on that server


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://", "names no host"),
        ("http://gpu0:80OO", "has a port that is not a number from 1 to 65535"),
        ("http://gpu0:99999", "has a port that is not a number from 1 to 65535"),
        ("http://a:8000,http://b:8000", "holds a space or a comma: one server's URL per entry"),
        ("http://gpu0:8000?x=1", "has a query or fragment"),
    ],
)
def test_a_url_no_request_could_reach_is_refused_naming_the_field(url, says):
    assert f"model.urls {url!r} {says}" in refused("openai", ["http://ok:8000", url])
    with pytest.raises(ConfigError, match="model.url "):
        load_config(overrides={"model.kind": "openai", "model.url": url}, environ={})


def test_credentials_in_a_url_are_refused_and_not_repeated():
    line = refused("openai", ["http://user:s3cret@gpu0:8000", "http://gpu1:8000"])
    assert "model.urls 'http://***@gpu0:8000' carries credentials" in line and "model.api_key_env" in line
    assert "s3cret" not in line and "user" not in line.split("carries")[0]
    with pytest.raises(ConfigError, match="critic.url 'http://\\*\\*\\*@c:9000' carries credentials"):
        load_config(overrides={"critic.kind": "http", "critic.url": "http://k:s3cret@c:9000"}, environ={})


def test_model_urls_given_as_one_string_says_how_to_write_the_list():
    line = refused("openai", "http://a:8000,http://b:8000")
    assert "takes a list of URLs, not the string 'http://a:8000,http://b:8000'" in line
    assert """write model.urls = ["http://a:8000", "http://b:8000"]""" in line


def test_an_endpoint_in_model_urls_names_that_field():
    line = refused("openai", ["http://a:8000/v1/completions", "http://b:8000"])
    assert "model.urls 'http://a:8000/v1/completions' names the endpoint" in line
    assert line.endswith("list 'http://a:8000' in model.urls instead (from --set model.urls)")


def test_mixed_schemes_and_one_entry_are_fine():
    two = load_config(overrides={"model.kind": "openai", "model.urls": ["http://a:8000", "https://b:8443/"]})
    assert isinstance(two.build_policy(), FleetPolicy)
    one = load_config(overrides={"model.kind": "openai", "model.urls": ["http://[::1]:8000"]})
    assert isinstance(one.build_policy(), OpenAICompatPolicy)


@pytest.mark.parametrize("policy", [OpenAICompatPolicy, SGLangPolicy, LlamaCppPolicy])
def test_a_library_policy_given_several_urls_says_to_use_a_fleet(policy):
    with pytest.raises(ValueError, match="base_url is one server's URL, not 2: .* FleetPolicy"):
        policy(["http://a:8000", "http://b:8000"])
    with pytest.raises(ValueError, match="holds a space or a comma"):
        policy("http://a:8000,http://b:8000")
    with pytest.raises(ValueError, match="carries credentials"):
        policy("http://u:p@a:8000")


def test_a_fleet_refuses_urls_for_policies_and_one_server_twice():
    with pytest.raises(TypeError, match=r"one HTTP policy per replica .* not str 'http://a:8000'"):
        FleetPolicy(["http://a:8000", "http://b:8000"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="replicas http://a:8000 and http://A:8000 are one server"):
        FleetPolicy([OpenAICompatPolicy("http://a:8000"), OpenAICompatPolicy("http://A:8000/v1/")])
