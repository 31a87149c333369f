"""Shared fixtures: the embedded model is loaded once per test session (it takes seconds, not minutes); tiny random
models speak a tiny tokenizer (``tests/data/tiny_tokenizer``), so the fast tier never touches the embedded model."""

import importlib.util
import os
import socket
import sys
from pathlib import Path
from types import MappingProxyType

import pytest
import torch

torch.set_grad_enabled(True)
# Under pytest-xdist (.ci/run's `-n 2`) the workers share the cores: each computes on its part of them, and so do the
# processes its tests start (report runs, notebook kernels, harness workers inherit OMP_NUM_THREADS), so that two
# workers on 2 cores run 2 torch threads, not 4 that take turns. Where threads still outnumber the cores (a caller's
# OMP_NUM_THREADS, which stands; a notebook's kernel on the caller's thread count), OpenMP's waiting threads sleep
# instead of spinning on a core another process needs.
CALLER_THREADS = os.environ.get("OMP_NUM_THREADS")  # the thread count this session was started with, if any
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if CALLER_THREADS is None:
        share = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
        os.environ["OMP_NUM_THREADS"] = str(share)
        torch.set_num_threads(share)
ROOT = Path(__file__).resolve().parents[1]
TINY_TOKENIZER = ROOT / "tests" / "data" / "tiny_tokenizer"


def tiny_tokenizer():
    """A fresh copy (tests change theirs) of the tests' tiny byte-level BPE (1,024 tokens; SmolLM2's special tokens,
    roles and chat rendering; written by ``tests/tiny_tokenizer.py``)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TINY_TOKENIZER)


def text_model(n_layers: int | None = None, arch: str = "llama", **overrides):
    """A tiny random llama (``arch="gpt2"``: a GPT-2, learned positions) that speaks the tiny tokenizer (fast: tests
    the plumbing, not the numbers), with a context of 128 tokens (a zero-shot item or two); ``overrides``: config
    fields (a longer ``n_ctx`` for few-shot prompts)."""
    from lens_heads.models.loading import tiny_model

    tokenizer = tiny_tokenizer()
    size = {"n_ctx": 128} | ({} if n_layers is None else {"n_layers": n_layers}) | overrides
    return tiny_model(arch, seed=0, d_vocab=len(tokenizer), tokenizer=tokenizer, default_prepend_bos=True, **size)


def load_script(name: str):
    """An ``analyses/`` script as a module (registered first: the script's dataclasses look their module up); a
    script imports only ``lens_heads``, so nothing goes on ``sys.path``."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "analyses" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# Float tolerances. Two correct float32 computations of one quantity differ by the order of their sums: the matmul
# kernel (picked by shape: batch size, padding, fused or eager attention, packed weights, a prefix computed apart),
# the thread count (each thread sums its share) and the CPU's instruction set (vector width). A sum is off by a few
# u = 2**-24 (6e-8, float32's unit roundoff) of the magnitudes summed into it, so an activation is off in proportion
# to its tensor's scale (a small element carries the rounding of the large ones it was summed with), compounded over
# the layers it went through; a summed log-likelihood is off in proportion to its size (each token's log-prob carries
# the rounding of logits of about its size). Measured on the tiny models here (2-5 layers, width 64), between the
# code paths the tests compare, with 1 and 2 threads and with ATen's unvectorised kernels and MKL's compatible code
# path (standing in for another CPU): activations and logits within 1e-6 of their tensor's largest magnitude, summed
# log-likelihoods within 3e-7 of their size plus 2e-6. The bounds below are 5-10x those. (The embedded model's 30
# layers need more: tests/bridge_agreement.py and the slow tests say theirs.)
ACTIVATION_REL = 1e-5  # of the tensor's largest magnitude
LOGLIK_TOL = dict(rtol=2e-6, atol=1e-5)  # summed log-likelihoods of the tiny models, in np.testing.assert_allclose


def assert_close_to_scale(actual, expected, rel: float = ACTIVATION_REL, scale=None, msg=None) -> None:
    """Elementwise ``|actual - expected| <= rel * scale``, ``scale`` the largest magnitude of ``expected`` unless
    given (another tensor's, when ``expected`` is a difference of two computed tensors): float32 rounding is a
    fraction of what was summed, not of each element (see the tolerances above)."""
    actual, expected = (torch.as_tensor(x).detach().double() for x in (actual, expected))
    bound = float(torch.as_tensor(expected if scale is None else scale).detach().abs().max())
    torch.testing.assert_close(actual, expected, rtol=0, atol=rel * bound, msg=msg)


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


# The guard: a test outside the slow tier that reaches the embedded model (its dequantised folder in the cache, or
# the dequantisation of its GGUF) fails, naming the test, even where the cache is warm and loading would be quick.
# Fixtures count for the test whose set-up runs them (a module fixture for the module's first test).
_RUNNING: list = [None]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _RUNNING[0] = item


def _refuse_outside_slow(what: str) -> None:
    item = _RUNNING[0]
    if item is not None and item.get_closest_marker("slow") is None:
        pytest.fail(f"{item.nodeid} is in the fast tier but {what}: give it the tiny tokenizer (conftest.text_model, "
                    "tiny_tokenizer) or mark it @pytest.mark.slow", pytrace=False)


def pytest_configure(config):
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistUnits())
    from lens_heads.models import embedded

    cache, dequantise = embedded.cache_dir, embedded.dequantise_gguf
    shared_cache = cache().resolve()

    def cache_dir():
        # within embedded.py only the embedded model's folder and GGUF ask for it (other modules keep their own
        # caches there); a test's own empty cache (LENS_HEADS_CACHE) holds no model
        if sys._getframe(1).f_globals.get("__name__") == embedded.__name__ and cache().resolve() == shared_cache:
            _refuse_outside_slow(f"reads the embedded model's cache ({shared_cache})")
        return cache()

    def dequantise_gguf(*args, **kwargs):
        _refuse_outside_slow("dequantises an embedded model's GGUF")
        return dequantise(*args, **kwargs)

    embedded.cache_dir, embedded.dequantise_gguf = cache_dir, dequantise_gguf


@pytest.fixture(scope="session")
def checkout_pages():
    """The pages ``scripts/render_docs.py`` renders from this checkout, read-only: a rendering takes about 5 s of
    CPU and test_docs, test_docs_readme and test_docs_render each compare or read the same one."""
    spec = importlib.util.spec_from_file_location("render_docs", ROOT / "scripts" / "render_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return MappingProxyType(module.render())


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


@pytest.fixture
def attention_calls(monkeypatch):
    """The layer ids of every attention call inside lens_heads's fused attention during the test: ``fused`` (SDPA,
    no pattern) and ``eager`` (a swapped layer that fell back to TransformerLens's attention, which materialises the
    whole [batch, head, query, key] pattern). Layers never swapped (windows, soft-caps) appear in neither."""
    from lens_heads.evaluation import fused_attention
    from lens_heads.models import tl_internals

    calls: dict[str, list[int]] = {"fused": [], "eager": []}
    eager, qkv = tl_internals.eager_attention, fused_attention._qkv

    def counted_eager(attn, *args, **kwargs):
        calls["eager"].append(attn.layer_id)
        return eager(attn, *args, **kwargs)

    def counted_qkv(attn, *args, **kwargs):  # the fused forward's first step
        calls["fused"].append(attn.layer_id)
        return qkv(attn, *args, **kwargs)

    monkeypatch.setattr(tl_internals, "eager_attention", counted_eager)
    monkeypatch.setattr(fused_attention, "_qkv", counted_qkv)
    return calls


# How pytest-xdist hands out the tests (.ci/run: `-n 2`): a test file is one unit, run by one worker, so that its
# module fixtures (a tiny model, a sweep, a report run) are computed once; except that each notebook's execution is a
# unit of its own (they share nothing and take a minute or more each), test_report_browser.py goes with
# test_report.py, whose report run it reads (report_run.py), and the docs tests go together, as they read one
# rendering of the checkout (checkout_pages, seconds of work). The units known to take longest go first, so that the
# two workers finish together instead of one starting a long unit at the end.
SAME_UNIT = {"tests/test_report_browser.py": "tests/test_report.py", "tests/test_docs_readme.py": "tests/test_docs.py",
             "tests/test_docs_render.py": "tests/test_docs.py"}
OWN_UNITS = ("tests/test_notebooks.py::test_a_fresh_execution_shows_the_committed_numbers",)
LONGEST_FIRST = ("tests/test_report.py", "tests/test_notebooks.py::test_a_fresh_execution", "tests/test_faults.py",
                 "tests/test_report_live.py")


def unit_of(nodeid: str) -> str:
    if nodeid.startswith(OWN_UNITS):
        return nodeid
    path = nodeid.split("::", 1)[0]
    return SAME_UNIT.get(path, path)


class XdistUnits:
    """Registered where pytest-xdist is loaded (its hook is unknown to pytest without it)."""

    def pytest_xdist_make_scheduler(self, config, log):
        return units_scheduler(config, log)


def units_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

        def schedule(self) -> None:
            if self.collection is None and self.collection_is_completed and self._check_nodes_have_same_collection():
                collection = list(next(iter(self.registered_collections.values())))
                units: dict[str, dict[str, bool]] = {}
                for nodeid in collection:
                    units.setdefault(self._split_scope(nodeid), {})[nodeid] = False
                first = sorted((u for u in units if u.startswith(LONGEST_FIRST)),
                               key=lambda u: next(i for i, p in enumerate(LONGEST_FIRST) if u.startswith(p)))
                for unit in first + [u for u in units if u not in first]:
                    self.workqueue[unit] = units[unit]
                config.option.loadscopereorder = False  # the order above stands
            super().schedule()

    return Units(config, log)


def count_layouts(monkeypatch) -> dict[str, int]:
    """How many gated-MLP and attention layouts are made from here on (counted into the returned dict)."""
    from lens_heads.evaluation import fused_attention, packed_weights

    made = {"gated": 0, "qkv": 0, "output": 0}
    for module, name, role in ((packed_weights, "_gated_layout", "gated"), (fused_attention, "_qkv_layout", "qkv"),
                               (fused_attention, "_output_layout", "output")):
        def counted(*weights, make=getattr(module, name), role=role):
            made[role] += 1
            return make(*weights)
        monkeypatch.setattr(module, name, counted)
    return made
