"""Decontamination against benchmark test sets given as files (n-gram overlap, MiniLM similarity).
One test loads the real bundled MiniLM model (seconds); the rest use n-grams only."""
from __future__ import annotations

import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from apps.datasets import decontam
from apps.datasets.models import DatasetVersion
from apps.datasets.services import dataset_version_create
from apps.datasets.spec import FilterSpecError
from apps.tasks.models import Trajectory
from tests.datasets.version_data import make_trajectory, no_dedup, run_build
from trajplatform.api_models import api_token_create

pytestmark = pytest.mark.django_db

GSM = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
       "How many clips did Natalia sell altogether in April and May?")
GSM_PARAPHRASE = ("In April Natalia sold clips to 48 friends; in May she sold half as many. "
                  "How many clips did she sell in total over April and May?")
HUMANEVAL = "def has_close_elements(numbers, threshold): check if in given list of numbers, are any two numbers " \
            "closer to each other than given threshold."


@pytest.fixture
def testsets(settings: Any, tmp_path: Path) -> Path:
    settings.DATASET_TESTSET_DIR = tmp_path / "testsets"
    settings.DATASET_TESTSET_DIR.mkdir()
    (settings.DATASET_TESTSET_DIR / "gsm8k-test.jsonl").write_text(
        json.dumps({"question": GSM, "answer": "72"}) + "\n"
        + json.dumps({"question": "A robe takes 2 bolts of blue fiber and half that much white fiber. How many "
                      "bolts in total does it take?", "answer": "3"}) + "\n")
    (settings.DATASET_TESTSET_DIR / "humaneval.jsonl").write_text(
        json.dumps({"task_id": "HumanEval/0", "prompt": HUMANEVAL}) + "\n")
    return settings.DATASET_TESTSET_DIR


def test_members_whose_prompt_copies_a_test_item_are_excluded_and_listed_in_the_card(
    make_task: Any, testsets: Path
) -> None:
    copied = make_trajectory(make_task(prompt=f"Solve this: {GSM} Show your work."))
    answer_leak = make_trajectory(make_task(prompt="Write a helper for lists."), answer=HUMANEVAL)
    Trajectory.objects.filter(pk=answer_leak.pk).update(final_answer=HUMANEVAL)  # as the loop sets it from finish
    clean = make_trajectory(make_task(prompt="Print the first ten primes."))
    out = StringIO()
    call_command("dataset_create", "clean", "--no-near-dedup", "--decontam", "gsm8k-test", "--decontam",
                 "humaneval", "--no-decontam-embedding", "--no-progress", stdout=out, stderr=StringIO())
    version = DatasetVersion.objects.get(dataset__name="clean")
    assert list(version.members.values_list("trajectory_id", flat=True)) == [clean.pk]
    assert version.counts["excluded_as_contaminated"] == 2
    assert ", 2 as contaminated" in out.getvalue()
    excluded = {e["trajectory_id"]: e for e in version.data_card["excluded"]}
    assert excluded[copied.pk]["stage"] == "decontam" and excluded[copied.pk]["benchmark"] == "gsm8k-test"
    assert excluded[copied.pk]["item"] == "1"
    # The item's text is its question and answer ("72"): the n-grams that run into the answer are not in the prompt.
    assert excluded[copied.pk]["reason"] == ("contaminated: prompt matches gsm8k-test item 1 (13-gram overlap "
                                             "0.95 >= 0.5)")
    assert excluded[answer_leak.pk]["reason"].startswith("contaminated: answer matches humaneval item HumanEval/0")
    card = version.data_card["decontam"]
    assert card["excluded_by_benchmark"] == {"gsm8k-test": 1, "humaneval": 1}
    assert card["test_set_files"]["gsm8k-test"]["items"] == 2 and len(card["test_set_files"]["humaneval"]["sha256"]) == 64
    assert (card["ngram"], card["ngram_threshold"], card["embedding"], card["model"]) == (13, 0.5, False, None)
    assert version.filter_spec["decontam"]["test_sets"] == ["gsm8k-test", "humaneval"]
    reasons = version.data_card["excluded_reasons"]
    assert sum(n for kind, n in reasons.items() if kind.startswith("contaminated: ")) == 2

    # A stricter overlap keeps the member that shares only some of the item's n-grams.
    partial = make_trajectory(make_task(prompt=GSM[:120] + " ... and what is the price of a clip?"))
    spec = no_dedup(decontam={"test_sets": ["gsm8k-test"], "embedding": False, "ngram_threshold": 0.9})
    v2 = dataset_version_create(dataset_name="strict", filter_spec=spec, actor=None)
    kept = set(v2.members.values_list("trajectory_id", flat=True))
    assert partial.pk in kept and copied.pk not in kept


def test_a_paraphrase_is_caught_by_minilm_similarity_not_by_ngrams(make_task: Any, testsets: Path) -> None:
    paraphrase = make_trajectory(make_task(prompt=GSM_PARAPHRASE))
    other = make_trajectory(make_task(prompt="Parse sales.csv and print the sum of the second column."))
    ngrams_only = dataset_version_create(dataset_name="p1", filter_spec=no_dedup(
        decontam={"test_sets": ["gsm8k-test"], "embedding": False}), actor=None)
    assert ngrams_only.counts["members"] == 2
    with_embedding = dataset_version_create(dataset_name="p2", filter_spec=no_dedup(
        decontam={"test_sets": ["gsm8k-test"], "cosine_threshold": 0.8}), actor=None)
    assert list(with_embedding.members.values_list("trajectory_id", flat=True)) == [other.pk]
    [entry] = with_embedding.data_card["excluded"]
    assert entry["trajectory_id"] == paraphrase.pk and "MiniLM cosine" in entry["reason"]
    assert with_embedding.data_card["decontam"]["model"] == "all-MiniLM-L6-v2"


def test_bad_decontamination_input_is_refused_before_any_work(make_task: Any, testsets: Path) -> None:
    make_trajectory(make_task(prompt="x"))
    with pytest.raises(FilterSpecError) as excinfo:
        dataset_version_create(dataset_name="bad", filter_spec={"decontam": {"test_sets": ["mmlu"]}}, actor=None)
    assert "test set 'mmlu': no mmlu.jsonl or mmlu.txt in DATASET_TESTSET_DIR" in excinfo.value.errors["decontam"]
    for bad, message in (({"test_sets": ["../etc/passwd"]}, "test_sets: a non-empty list"),
                         ({"test_sets": ["humaneval"], "ngram": 0}, "ngram: a whole number from 1 to 50"),
                         ({"test_sets": ["humaneval"], "cosine_threshold": 1.5}, "cosine_threshold: a number"),
                         ({"test_sets": ["humaneval"], "fuzzy": True}, "unknown key(s) fuzzy")):
        with pytest.raises(FilterSpecError) as excinfo:
            dataset_version_create(dataset_name="bad", filter_spec={"decontam": bad}, actor=None)
        assert message in excinfo.value.errors["decontam"], (bad, excinfo.value.errors)
    (testsets / "broken.jsonl").write_text('{"question": "fine"}\n{not json\n')
    with pytest.raises(CommandError, match=r"decontam: broken.jsonl:2: not JSON"):
        call_command("dataset_create", "bad", "--no-near-dedup", "--decontam", "broken", "--no-decontam-embedding",
                     "--no-progress", stdout=StringIO(), stderr=StringIO())
    assert not DatasetVersion.objects.exists()
    # A .txt test set: one item per line.
    (testsets / "lines.txt").write_text("first item text here\nsecond item\n")
    assert [i.text for i in decontam.load_test_set("lines").items] == ["first item text here", "second item"]


def test_the_api_creates_a_decontaminated_version(make_task: Any, make_user: Any, testsets: Path) -> None:
    copied = make_trajectory(make_task(prompt=GSM))
    make_trajectory(make_task(prompt="Print primes."))
    user = make_user("approver")
    _token, raw = api_token_create(user=user, name="tests", actor=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    response = client.post("/api/v1/datasets/api-clean/versions", {"filter_spec": no_dedup(
        decontam={"test_sets": ["gsm8k-test"], "embedding": False})}, format="json")
    assert response.status_code == 202, response.content
    card = run_build(response.json()["id"]).data_card
    assert card["counts"]["excluded_as_contaminated"] == 1
    assert [e["trajectory_id"] for e in card["excluded"] if e["stage"] == "decontam"] == [copied.pk]
    response = client.post("/api/v1/datasets/api-clean/versions", {"filter_spec": {"decontam": {"test_sets": []}}},
                           format="json")
    assert response.status_code == 400 and response.json()["error"]["details"]["errors"][0]["field"] == "decontam"


def test_members_are_checked_a_block_at_a_time_with_the_same_result(testsets: Path) -> None:
    import hashlib

    import numpy as np

    def stand_in(texts: Any) -> Any:  # a deterministic embedder: a paraphrase of GSM lands on GSM
        out = []
        for t in texts:
            key = GSM if t in (GSM_PARAPHRASE, GSM) or t.startswith("Natalia") else t
            seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
            v = np.random.default_rng(seed).standard_normal(32)
            out.append(v / np.linalg.norm(v))
        return np.stack(out)

    members = [decontam.Member(1, f"Solve this: {GSM} Show your work.", ""),
               decontam.Member(2, "Print the first ten primes.", "2 3 5"),
               decontam.Member(3, GSM_PARAPHRASE, ""),
               decontam.Member(4, "Write a helper for lists.", HUMANEVAL),
               decontam.Member(5, "Sort a list.", "")]
    spec = decontam.validate_spec({"test_sets": ["gsm8k-test", "humaneval"]})
    whole = decontam.check(iter(members), spec, embedder=stand_in)
    blocks = decontam.check(iter(members), spec, embedder=stand_in, block=2)
    assert whole.matches == blocks.matches
    assert {k: m.method for k, m in whole.matches.items()} == {1: "ngram", 3: "embedding", 4: "ngram"}
