"""Shared fixtures: the embedded model is loaded once per test session (it takes seconds, not minutes)."""

import importlib.util
import socket
import sys
from pathlib import Path

import pytest
import torch

torch.set_grad_enabled(True)
ROOT = Path(__file__).resolve().parents[1]


def text_model(n_layers: int | None = None, **overrides):
    """A tiny random llama that speaks the embedded model's tokenizer (fast: tests the plumbing, not the numbers);
    ``overrides``: config fields (a longer ``n_ctx`` for few-shot prompts)."""
    from transformers import AutoTokenizer

    from lens_heads.models.loading import embedded_model_folder, tiny_model

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_folder())
    size = ({} if n_layers is None else {"n_layers": n_layers}) | overrides
    return tiny_model("llama", seed=0, d_vocab=len(tokenizer), tokenizer=tokenizer, default_prepend_bos=True, **size)


def load_script(name: str):
    """An ``analyses/`` script as a module (registered first: the script's dataclasses look their module up), its
    folder on the path as when it runs as a script (it imports its neighbour shared_settings by name)."""
    if str(ROOT / "analyses") not in sys.path:
        sys.path.insert(0, str(ROOT / "analyses"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "analyses" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# Test tiers: `pytest -m "not slow"` is the fast tier (tiny random models, no browser, no subprocesses); the full
# suite runs in .ci/run. A test that loads the embedded model (the smollm fixture, directly or through another
# fixture) is slow; so is every notebook, browser and torchrun test.
SLOW_FIXTURES = {"smollm"}
SLOW_MARKERS = {"notebook", "browser", "torchrun"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        report_run = item.module.__name__ == "test_report" and "run" in item.fixturenames  # the report, end to end
        if report_run or SLOW_FIXTURES & set(item.fixturenames) or SLOW_MARKERS & {m.name for m in item.iter_markers()}:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def smollm():
    from lens_heads import load_model

    return load_model()


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a socket fails, as on a machine with no route to the hub; the fixture's value counts
    the attempts (a loader that fails fast tries once, it does not retry)."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network blocked by test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    yield attempts
