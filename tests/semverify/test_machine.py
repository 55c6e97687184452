"""The allocator setting for CPU decoding: applied on glibc, refused (nothing changed) elsewhere."""

import platform

from semverify import machine


def test_keep_large_buffers_takes_on_glibc_and_refuses_elsewhere(monkeypatch):
    on_glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert machine.keep_large_buffers() is on_glibc
    monkeypatch.setattr(machine.platform, "libc_ver", lambda: ("musl", "1.2"))
    assert machine.keep_large_buffers() is False
    monkeypatch.setattr(machine.platform, "system", lambda: "Darwin")
    assert machine.keep_large_buffers() is False
