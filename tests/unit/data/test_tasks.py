"""The JSONL task reader: valid files round-trip, each broken line gets one error naming it."""

from __future__ import annotations

import codecs
import json

import pytest

from trainer_core.data.tasks import (
    FEWSHOT_SEPARATOR,
    NEXT_LINE_FILE,
    TaskExample,
    TaskFormatError,
    check_task_files,
    load_tasks,
    next_line_examples,
    read_task,
    write_task,
)
from trainer_core.errors import UserError

GOOD = {"context": "2 + 2 =", "choices": [" 4", " 5"], "gold": 0}


def _write(tmp_path, lines: list[str]):
    path = tmp_path / "task.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_valid_file_round_trips(tmp_path):
    shot = {"context": "1 + 1 =", "choices": [" 2", " 3"], "gold": 0}
    examples = [GOOD, {**GOOD, "gold": 1, "fewshot": [shot, "A plain text shot."]}]
    path = write_task(tmp_path / "arith.jsonl", examples)
    task = read_task(path)
    assert task.name == "arith"
    assert task.examples[0] == TaskExample("2 + 2 =", (" 4", " 5"), 0)
    prefix = "1 + 1 = 2" + FEWSHOT_SEPARATOR + "A plain text shot." + FEWSHOT_SEPARATOR
    assert task.examples[1] == TaskExample(prefix + "2 + 2 =", (" 4", " 5"), 1)
    assert len(load_tasks([str(path)], max_examples=1)[0].examples) == 1


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ({"choices": [" 4", " 5"], "gold": 0}, "missing field 'context'"),
        ({**GOOD, "gold": 2}, "'gold' is 2, outside 0..1"),
        ({**GOOD, "gold": -1}, "'gold' is -1"),
        ({**GOOD, "gold": "0"}, "'gold' must be int"),
        ({**GOOD, "gold": True}, "'gold' must be int"),
        ({**GOOD, "choices": " 4"}, "'choices' must be list"),
        ({**GOOD, "choices": [" 4"]}, "at least 2"),
        ({**GOOD, "fewshot": [{"context": "x", "choices": ["a", "b"]}]}, "fewshot[0]: missing"),
        ({**GOOD, "fewshot": "x"}, "'fewshot' must be a list"),
        ({**GOOD, "uncond_context": 3}, "'uncond_context' must be str"),
        ({**GOOD, "choices": [" 4", " 5", " 4"]}, "lists ' 4' more than once"),
        (
            {**GOOD, "uncond_contxt": "A:"},
            "unknown field 'uncond_contxt' (did you mean 'uncond_context'?); the fields are "
            "context, choices, gold, fewshot, uncond_context",
        ),
        (
            {**GOOD, "fewshot": [{**GOOD, "uncond_context": "A:"}]},
            "fewshot[0]: unknown field 'uncond_context'; the fields are context, choices, gold",
        ),
    ],
)
def test_bad_line_names_file_and_line(tmp_path, bad, words):
    path = _write(tmp_path, [json.dumps(GOOD), "", json.dumps(bad)])
    with pytest.raises(TaskFormatError) as err:
        read_task(path)
    message = str(err.value)
    assert isinstance(err.value, UserError)
    assert message.startswith(f"{path}:3: ")
    assert words in message
    assert "\n" not in message


def test_uncond_context_is_kept_as_is_without_the_fewshot_prefix(tmp_path):
    shot = {"context": "1 + 1 =", "choices": [" 2", " 3"], "gold": 0}
    line = {**GOOD, "fewshot": [shot], "uncond_context": "Answer:"}
    path = write_task(tmp_path / "calibrated.jsonl", [line, {**GOOD, "uncond_context": ""}])
    first, second = read_task(path).examples
    assert first.prompt.startswith("1 + 1 = 2") and first.uncond_prompt == "Answer:"
    assert second.uncond_prompt == ""
    assert read_task(write_task(tmp_path / "plain.jsonl", [GOOD])).examples[0].uncond_prompt is None


def test_uncond_context_on_some_examples_only_names_both_lines(tmp_path):
    path = _write(tmp_path, [json.dumps(GOOD), "", json.dumps({**GOOD, "uncond_context": " "})])
    with pytest.raises(TaskFormatError) as err:
        read_task(path)
    assert str(err.value) == (
        f"{path}:3: 'uncond_context' is on line 3 but not on line 1; "
        "give it to every example or to none (one accuracy per task)"
    )


def test_invalid_json_names_file_and_line(tmp_path):
    path = _write(tmp_path, [json.dumps(GOOD), '{"context": "x",'])
    with pytest.raises(TaskFormatError, match=rf"^{path}:2: not valid JSON"):
        read_task(path)


def test_lines_end_at_newlines_alone(tmp_path):
    """U+2028 and U+0085 may stand raw in a JSON string (``ensure_ascii=False``); split there as
    str.splitlines did, a valid line was "Unterminated string" and later lines misnumbered."""
    odd = {**GOOD, "context": "a\u2028b\u2029c\x85d 2 + 2 ="}
    lines = [json.dumps(odd, ensure_ascii=False), json.dumps(GOOD) + "\r", '{"context": "x",']
    path = _write(tmp_path, lines)
    with pytest.raises(TaskFormatError, match=rf"^{path}:3: not valid JSON"):
        read_task(path)
    path = _write(tmp_path, lines[:2])
    assert [e.prompt for e in read_task(path).examples] == [odd["context"], GOOD["context"]]


def test_a_byte_order_mark_is_skipped(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(codecs.BOM_UTF8 + json.dumps(GOOD).encode() + b"\r\n")
    assert read_task(path).examples == (TaskExample("2 + 2 =", (" 4", " 5"), 0),)


def test_a_byte_that_is_not_utf8_is_named_by_its_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b'\n{"context": "caf\xe9 =", "choices": []}\n')
    with pytest.raises(TaskFormatError) as err:
        read_task(path)
    assert str(err.value) == (
        f"{path}:2: not UTF-8: byte 17 of the line is 0xe9 (invalid continuation byte); "
        "save the file as UTF-8"
    )


def test_missing_task_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        load_tasks([str(tmp_path / "nope.jsonl")])


def test_two_files_of_one_name_are_refused_naming_both(tmp_path):
    """Metrics are keyed by task name (the file's stem): arc/val.jsonl and hellaswag/val.jsonl
    both wrote task/val/*, the second silently replacing the first."""
    first = write_task(tmp_path / "arc" / "val.jsonl", [GOOD])
    second = write_task(tmp_path / "hellaswag" / "val.jsonl", [GOOD])
    with pytest.raises(TaskFormatError) as err:
        load_tasks([str(first), str(second)])
    assert str(err.value).startswith(f"evals.tasks: {first} and {second} are both task 'val'")
    with pytest.raises(TaskFormatError, match="list each file once"):
        load_tasks([str(first), str(first)])


def test_a_task_url_is_refused_not_looked_up_as_a_path():
    with pytest.raises(TaskFormatError, match="read from local paths, not fetched"):
        load_tasks(["s3://bucket/tasks/qa.jsonl"])


def test_check_task_files_reads_the_files_and_leaves_the_built_ins(tmp_path, monkeypatch):
    """What a launch checks before Ray starts: each file as its runs will read it (a bad line
    beyond max_examples is not read), names included; a built-in task is not built here."""
    good = write_task(tmp_path / "qa.jsonl", [GOOD, {**GOOD, "gold": 9}])
    monkeypatch.setattr("trainer_core.data.tasks.build_next_line_task", pytest.fail)
    check_task_files(["demo_next_line", str(good)], max_examples=1)
    with pytest.raises(TaskFormatError, match=rf"^{good}:2: 'gold' is 9"):
        check_task_files(["demo_next_line", str(good)])
    twin = write_task(tmp_path / "demo_next_line.jsonl", [GOOD])
    with pytest.raises(TaskFormatError, match=f"^evals.tasks: demo_next_line and {twin} are both"):
        check_task_files(["demo_next_line", str(twin)])


def test_next_line_examples_are_valid_and_deterministic():
    text = "\n".join(f"    value_{i} = compute_{i}(x, {i})" for i in range(60))
    first = next_line_examples([text], seed=3, n=20)
    assert first == next_line_examples([text], seed=3, n=20)
    assert len(first) == 20
    lines = text.splitlines()
    for ex in first:
        assert len(ex["choices"]) == 4 and len(set(ex["choices"])) == 4
        true = ex["choices"][ex["gold"]].strip()
        before = ex["context"].rstrip(" ").splitlines()[-1]
        assert lines[lines.index(before) + 1].strip() == true
        assert ex["uncond_context"] == "\n    " == "\n" + ex["context"].rsplit("\n", 1)[-1]


def test_demo_next_line_is_built_once_from_held_out_files(tmp_path):
    (task,) = load_tasks(["demo_next_line"], tmp_path, max_examples=50)
    assert task.name == "demo_next_line" and len(task.examples) == 50
    assert all(len(e.choices) == 4 for e in task.examples)
    assert all(e.uncond_prompt is not None for e in task.examples)
    built = tmp_path / NEXT_LINE_FILE
    stamp = built.stat().st_mtime_ns
    assert load_tasks(["demo_next_line"], tmp_path)[0].examples[:50] == task.examples
    assert built.stat().st_mtime_ns == stamp
