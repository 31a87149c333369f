"""Shared fixtures: the embedded model is loaded once per test session (it takes seconds, not minutes)."""

import socket

import pytest
import torch

torch.set_grad_enabled(True)


@pytest.fixture(scope="session")
def smollm():
    from lens_heads import load_model

    return load_model()


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a socket fails, as on a machine with no route to the hub."""

    def refuse(*args, **kwargs):
        raise OSError("network blocked by test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    yield
