"""The public API's shape: every namespace says what it exports, and no public function takes more than eight named
parameters besides its settings value (``settings``, a sweep's ``plan``) and ``progress``; longer lists become a
frozen value whose fields stay keywords (:mod:`lens_heads.plumbing.values`)."""

import inspect
import types

import pytest

import lens_heads as lh

MAX_PARAMETERS = 8
VALUES = ("settings", "plan", "progress")  # the settings values a function takes whole, and its progress bar


def namespaces() -> dict[str, types.ModuleType]:
    """``lh`` and the namespaces it exports (``lh.training``, ``lh.corpus``, ...)."""
    found = {"lh": lh}
    found.update({f"lh.{name}": getattr(lh, name) for name in lh.__all__
                  if isinstance(getattr(lh, name), types.ModuleType)})
    return found


def public_callables():
    for label, module in namespaces().items():
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isfunction(obj) or (inspect.isbuiltin(obj) and callable(obj)):
                yield f"{label}.{name}", obj


def named_parameters(function) -> list[str]:
    """The parameters a caller names (not ``*args``/``**options``, not the settings values nor their fields, which
    the signature lists as keywords: ``lens_heads.plumbing.values.keywords``)."""
    fields = set(getattr(function, "__value_fields__", ()))
    return [p.name for p in inspect.signature(function).parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in VALUES and p.name not in fields]


@pytest.mark.parametrize("label", sorted(namespaces()))
def test_every_namespace_lists_its_exports_and_only_its_own(label):
    module = namespaces()[label]
    assert hasattr(module, "__all__"), f"{label} has no __all__: list the names it exports"
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing, f"{label}.__all__ names {missing}, which it lacks"
    objects = {name: getattr(module, name) for name in module.__all__}
    foreign = [name for name, obj in objects.items() if (inspect.isclass(obj) or inspect.isfunction(obj)) and
               not obj.__module__.startswith("lens_heads")]  # e.g. dataclasses.dataclass, imported to be used
    assert not foreign, f"{label} exports {foreign}, which belong to other libraries"


def test_no_public_function_takes_more_than_eight_named_parameters():
    long = {label: len(named_parameters(f)) for label, f in public_callables()
            if len(named_parameters(f)) > MAX_PARAMETERS}
    assert not long, f"give these a settings value (lens_heads.plumbing.values): {long}"


def test_the_rule_counts_what_a_caller_names():
    def wide(a, b, c, d, e, f, g, h, i, *args, settings=None, progress=True, **options):
        pass

    def narrow(a, b, c, d, e, f, g, h, *, plan=None, settings=None, progress=True, **options):
        pass

    assert len(named_parameters(wide)) == 9 and len(named_parameters(narrow)) == 8
    assert len(named_parameters(lh.run_sweep)) <= MAX_PARAMETERS
    assert "plan" in inspect.signature(lh.run_sweep).parameters


# keywords handed whole to another library, which owns their names
PASS_THROUGH = {"lh.tiny_model": "TransformerLens's HookedTransformerConfig fields",
                "lh.corpus.load_corpus": "datasets.load_dataset's arguments",
                "lh.corpus.hf_documents": "datasets.load_dataset's arguments"}


def test_every_public_function_names_every_keyword_it_accepts():
    """No public function hides its keywords behind ``**options``: its signature lists the fields of the settings
    values it lays them over (``help()``, IDEs and the API reference show them)."""
    from dataclasses import fields

    hidden = [label for label, f in public_callables() if label not in PASS_THROUGH and
              any(p.kind is p.VAR_KEYWORD for p in inspect.signature(f).parameters.values())]
    assert not hidden, f"these take **options their signature does not name: {hidden}"
    laid_over = {lh.evaluate: [lh.EvalSettings], lh.evaluate_each: [lh.EvalSettings], lh.score_heads: [lh.EvalSettings],
                 lh.run_sweep: [lh.SweepPlan, lh.EvalSettings], lh.ranking_sweep: [lh.EvalSettings],
                 lh.head_effects: [lh.EvalSettings], lh.layer_scores: [lh.EvalSettings],
                 lh.compare_distributions: [lh.DistributionSettings], lh.attention_rank: [lh.RankSettings]}
    for function, values in laid_over.items():
        named = set(inspect.signature(function).parameters)
        missing = [f.name for value in values for f in fields(value) if f.name not in named]
        assert not missing, f"{function.__name__} accepts {missing}, which its signature does not name"


def test_a_keyword_the_signature_does_not_name_is_refused():
    """What the signatures list is all a call accepts: any other keyword is refused by name before any work."""
    with pytest.raises(lh.InputError, match="unknown setting batchsize"):
        lh.evaluate(None, [], batchsize=4)
    with pytest.raises(lh.InputError, match="unknown setting fraction"):
        lh.run_sweep(None, [], fraction=[0.1], progress=False)
    assert "batchsize" not in inspect.signature(lh.evaluate).parameters
    assert "fraction" not in inspect.signature(lh.run_sweep).parameters


def test_every_settings_and_result_value_the_namespaces_export_is_frozen():
    """A settings value cannot be changed in place: a variant is ``dataclasses.replace(value, ...)``."""
    import dataclasses

    mutable = [f"{label}.{name}" for label, module in namespaces().items() for name in module.__all__
               if name.endswith(("Config", "Settings", "Plan")) and dataclasses.is_dataclass(getattr(module, name))
               and not getattr(module, name).__dataclass_params__.frozen]
    assert not mutable, f"make these frozen dataclasses: {mutable}"
    config = lh.training.TrainConfig(steps=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.steps = 4  # type: ignore[misc]
    assert dataclasses.replace(config, steps=4).steps == 4 and config.steps == 3


def test_no_function_from_evaluate_to_the_forward_takes_more_than_five_parameters():
    """The evaluator's path (``lh.evaluate`` to rows, passes, shared prefixes, the fused blocks and attention,
    log-likelihoods) passes values instead of long lists, measured as the architecture page measures it
    (``scripts/pages/contracts.py``)."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("contracts", root / "scripts" / "pages" / "contracts.py")
    assert spec is not None and spec.loader is not None
    contracts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(contracts)
    assert "evaluation/prefix.py" in contracts.EVALUATOR  # the path reaches the fused attention's functions
    where, count = contracts.widest_on_path(root / "lens_heads")
    assert count <= 5, f"{where} takes {count} parameters: pass a value (evaluate.EvalRun, passes.Work, prefix.QKV)"
