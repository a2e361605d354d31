"""HOST:PORT: the one parser every platform address and job.yaml's controller go through."""

from __future__ import annotations

import pytest

from launchers.address import AddressError, address_host, join_host_port, parse_tcp_url, split_host_port
from launchers.errors import PlatformError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10.0.0.1:2222", ("10.0.0.1", 2222)),
        (" job-ps-0.job:2222 ", ("job-ps-0.job", 2222)),
        ("[fe80::1]:2222", ("fe80::1", 2222)),
        ("[fe80::1%eth0]:1", ("fe80::1%eth0", 1)),
    ],
)
def test_host_and_port(text: str, expected: tuple[str, int]) -> None:
    assert split_host_port(text, "--worker_hosts") == expected


def test_a_host_alone_takes_the_default_port_only_where_there_is_one() -> None:
    assert split_host_port("ctrl", "high_availability.controller", default_port=30051) == ("ctrl", 30051)
    assert split_host_port("[::1]", "x", default_port=7) == ("::1", 7)
    with pytest.raises(AddressError, match="has no port"):
        split_host_port("ctrl", "--ps_hosts")


@pytest.mark.parametrize(
    ("text", "says"),
    [("fe80::1:2222", "in brackets"), ("h:0", "not a TCP port"), ("h:65536", "not a TCP port"), ("a b:1", "HOST:PORT")],
)
def test_bad_addresses_name_the_setting_and_the_problem(text: str, says: str) -> None:
    with pytest.raises(AddressError, match=says) as caught:
        split_host_port(text, "--worker_hosts")
    assert str(caught.value).startswith(f"--worker_hosts={text!r}")
    assert isinstance(caught.value, PlatformError) and isinstance(caught.value, ValueError)


def test_hosts_and_urls() -> None:
    assert address_host("[::1]:5") == "::1" and address_host("h:5") == "h" and address_host("h") == "h"
    assert join_host_port("::1", 5) == "[::1]:5" and join_host_port("h", 5) == "h:5"
    assert parse_tcp_url("tcp://[::1]:6666/") == ("::1", 6666)
    with pytest.raises(PlatformError, match="expected tcp://HOST:PORT"):
        parse_tcp_url("10.0.0.1:6666")
