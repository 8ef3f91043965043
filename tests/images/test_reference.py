"""Image reference parsing, scheme choice and other pure helpers of the registry client."""

from __future__ import annotations

import pytest

from agentenv.errors import InvalidInput
from agentenv.images.manifest import parse_manifest, select_platform
from agentenv.images.reference import ImageRef, parse_reference
from agentenv.images.registry_auth import parse_challenge
from agentenv.images.registry_errors import NoMatchingPlatform, redact_url
from agentenv.images.registry_transport import RetryPolicy, base_url, is_loopback

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ubuntu", ImageRef("docker.io", "library/ubuntu", "latest", None)),
        ("ubuntu:22.04", ImageRef("docker.io", "library/ubuntu", "22.04", None)),
        ("user/repo", ImageRef("docker.io", "user/repo", "latest", None)),
        ("docker.io/ubuntu", ImageRef("docker.io", "library/ubuntu", "latest", None)),
        ("index.docker.io/user/repo:1", ImageRef("docker.io", "user/repo", "1", None)),
        ("registry:5000/repo:tag", ImageRef("registry:5000", "repo", "tag", None)),
        ("registry:5000/a/b/c", ImageRef("registry:5000", "a/b/c", "latest", None)),
        ("ghcr.io/o/r:v1.2_x-y", ImageRef("ghcr.io", "o/r", "v1.2_x-y", None)),
        ("localhost/x", ImageRef("localhost", "x", "latest", None)),
        ("localhost:5000/x:1", ImageRef("localhost:5000", "x", "1", None)),
        ("[::1]:5000/x", ImageRef("[::1]:5000", "x", "latest", None)),
        (f"repo@{DIGEST}", ImageRef("docker.io", "library/repo", None, DIGEST)),
        (f"q.io/r:t@{DIGEST}", ImageRef("q.io", "r", "t", DIGEST)),
        ("a__b/c.d-e", ImageRef("docker.io", "a__b/c.d-e", "latest", None)),
    ],
)
def test_parse(text: str, expected: ImageRef) -> None:
    assert parse_reference(text) == expected


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("ubuntu", "docker.io/library/ubuntu:latest"),
        (f"repo@{DIGEST}", f"docker.io/library/repo@{DIGEST}"),
        (f"q.io/r:t@{DIGEST}", f"q.io/r:t@{DIGEST}"),
    ],
)
def test_str_is_canonical_and_reparses(text: str, shown: str) -> None:
    ref = parse_reference(text)
    assert str(ref) == shown
    assert parse_reference(str(ref)) == ref


def test_api_host_and_reference() -> None:
    assert parse_reference("ubuntu").api_host == "registry-1.docker.io"
    assert parse_reference("q.io:443/r").api_host == "q.io:443"
    assert parse_reference("r:t").reference == "t"
    assert parse_reference(f"r:t@{DIGEST}").reference == DIGEST


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ubuntu",
        "Ubuntu",
        "ubuntu:",
        "ubuntu:bad/tag",
        "ubuntu:-x",
        "repo@sha256:123",
        "repo@md5:" + "a" * 32,
        "host.io/",
        "a//b",
        "a/-b",
        "UP.io/Repo",
        "x" * 300,
    ],
)
def test_invalid(text: str) -> None:
    with pytest.raises(InvalidInput, match="invalid image reference"):
        parse_reference(text)


def test_invalid_is_a_400() -> None:
    with pytest.raises(InvalidInput) as info:
        parse_reference("Bad")
    assert info.value.status == 400


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("localhost:5000", True),
        ("127.0.0.1:5000", True),
        ("127.1.2.3", True),
        ("[::1]:5000", True),
        ("[::1]", True),
        ("10.0.0.1:5000", False),
        ("registry.local", False),
        ("localhost.example.com", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_scheme() -> None:
    assert base_url("127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert base_url("ghcr.io") == "https://ghcr.io"
    assert base_url("reg.lan:5000", ["reg.lan:5000"]) == "http://reg.lan:5000"


def test_retry_defaults_are_small() -> None:
    assert list(RetryPolicy().delays()) == pytest.approx([0.1, 0.3])
    assert list(RetryPolicy(attempts=1).delays()) == []


def test_parse_challenge() -> None:
    c = parse_challenge(
        'Bearer realm="https://auth.docker.io/token",service="registry.docker.io",'
        'scope="repository:library/ubuntu:pull"'
    )
    assert c is not None and c.scheme == "bearer"
    assert c.params == {
        "realm": "https://auth.docker.io/token",
        "service": "registry.docker.io",
        "scope": "repository:library/ubuntu:pull",
    }
    basic = parse_challenge('Basic realm="x"')
    assert basic is not None and basic.scheme == "basic"
    assert parse_challenge("") is None


def test_redact_url() -> None:
    url = "https://u:p@cdn.example/blob?X-Amz-Signature=secret&expires=1"
    redacted = redact_url(url)
    assert "secret" not in redacted and "u:p" not in redacted
    assert redacted.startswith("https://cdn.example/blob?X-Amz-Signature=REDACTED")


def test_select_platform_lists_available() -> None:
    index = parse_manifest(
        b'{"schemaVersion":2,"manifests":['
        b'{"mediaType":"m","digest":"' + DIGEST.encode() + b'","size":1,'
        b'"platform":{"os":"linux","architecture":"arm64","variant":"v8"}},'
        b'{"mediaType":"m","digest":"' + DIGEST.encode() + b'","size":1,'
        b'"platform":{"os":"unknown","architecture":"unknown"}}]}',
        "application/vnd.oci.image.index.v1+json",
    )
    assert select_platform(index, "linux/arm64", "x").platform == "linux/arm64/v8"
    with pytest.raises(NoMatchingPlatform, match=r"no linux/amd64 .*available: linux/arm64/v8\)"):
        select_platform(index, "linux/amd64", "x")


def test_schema1_is_refused() -> None:
    with pytest.raises(InvalidInput, match="schema 1"):
        parse_manifest(b'{"schemaVersion":1,"fsLayers":[]}', "application/json")
