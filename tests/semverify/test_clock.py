"""The device clock waits for an accelerator's queue before it reads the time, and costs nothing on the CPU."""

import time

import torch

from semverify.engine.clock import device_clock


def test_cpu_clock_is_the_plain_counter():
    assert device_clock("cpu") is time.perf_counter
    assert device_clock(torch.device("cpu")) is time.perf_counter


def test_cuda_clock_synchronises_the_device_before_each_reading(monkeypatch):
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append(("sync", str(device))))
    monkeypatch.setattr(time, "perf_counter", lambda: events.append(("read", None)) or 1.5)
    clock = device_clock("cuda:1")
    assert events == []  # building the clock does not touch the device
    assert clock() == 1.5 and clock() == 1.5
    assert events == [("sync", "cuda:1"), ("read", None)] * 2
