"""The emulated-hosts helper: namespaces, bridge, rate limit, loss, cleanup."""
from __future__ import annotations

import subprocess
import sys

import pytest

from ringflow.testing import netns

REASON = netns.available()
pytestmark = [pytest.mark.skipif(REASON is not None, reason=f"multi-host emulation unavailable: {REASON}"),
              pytest.mark.long]


def _tcp_echo_roundtrip(cl: netns.NetnsCluster) -> str:
    server = subprocess.Popen(cl.command(1, [sys.executable, "-c",
                              "import socket;s=socket.socket();s.bind(('0.0.0.0',5001));s.listen();"
                              "c,_=s.accept();c.sendall(c.recv(5))"]))
    try:
        client = subprocess.run(cl.command(0, [sys.executable, "-c",
                                "import socket,time\n"
                                "for i in range(50):\n"
                                "  try:\n"
                                f"    s=socket.create_connection(('{cl.address(1)}',5001),timeout=2);break\n"
                                "  except OSError: time.sleep(0.05)\n"
                                "s.sendall(b'hello');print(s.recv(5).decode())"]),
                                capture_output=True, text=True, timeout=20)
        return client.stdout.strip()
    finally:
        server.kill()
        server.wait()


def test_two_hosts_talk_and_are_removed():
    with netns.NetnsCluster(2, rate_mbit=100) as cl:
        names = list(cl.names)
        assert _tcp_echo_roundtrip(cl) == "hello"
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in listed for n in names)
