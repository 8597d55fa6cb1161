"""The loading edge: every malformed stack file is one readable refusal naming where, found fast."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpu_k8s.components.configbase import ConfigError
from gpu_k8s.tools.engine import stack_config
from gpu_k8s.tools.plan import StackNotFound, main, stack_file
from gpu_k8s.tools.stackfile import MAX_DEPTH, MAX_VALUES, load_stack_file

# Nine levels of ten aliases each: 10^9 strings once expanded, from a file of a few hundred bytes.
ALIAS_BOMB = (
    "config:\n  l0: &l0 ["
    + ", ".join(['"x"'] * 10)
    + "]\n"
    + "".join(
        f"  l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * 10) + "]\n" for level in range(1, 9)
    )
)
DISAGREE = "YAML readers disagree on this plain value (PyYAML reads"


def refusal(tmp_path: Path, text: str | bytes) -> str:
    path = tmp_path / "Pulumi.x.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(ConfigError) as raised:
        load_stack_file(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: ")
    assert "Traceback" not in message and "tag:yaml.org" not in message
    return message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "config:\n  gpu-k8s:cluster:\n    name: a\n    name: b\n",
            'gpu-k8s:cluster.name (line 4): "name" - is set twice in the same mapping',
        ),
        (
            "config:\n  gpu-k8s:cluster:\n    name: 2024-01-01\n",
            "cluster.name (line 3): YAML reads this as a date",
        ),
        ("config:\n  x: !!set {a, b}\n", "x (line 2): YAML reads this as a set"),
        ("config:\n  x: !!binary aGVsbG8=\n", "x (line 2): YAML reads this as binary data"),
        ("config:\n  x:\n    <<: {a: 1}\n", "x.<< (line 3): YAML reads this as a merge key"),
        ("config:\n  x: !custom 3\n", "has a YAML tag no stack setting takes"),
        (
            "config:\n  x: yes\n",
            f'x (line 2): "yes" - {DISAGREE} a boolean',
        ),
        (
            "config:\n  x: on\n",
            f'x (line 2): "on" - {DISAGREE} a boolean',
        ),
        (
            "config:\n  x: 1:30\n",
            f'x (line 2): "1:30" - {DISAGREE} a number',
        ),
        (
            "config:\n  x: .inf\n",
            f'x (line 2): ".inf" - {DISAGREE} a number',
        ),
        ("config:\n  ? [a, b]\n  : 1\n", "config (line 2): has a key that is not a plain string"),
        ("- config\n", "the file: is a list, not a mapping"),
        ("just text\n", "the file: is a string, not a mapping"),
        ("config:\n  - a\n", "config: is a list, not a mapping"),
        ("config: 3\n", "config: is a number, not a mapping"),
        ("config: [\n", "is not valid YAML"),
        ("config:\n  a: b\n c: d\n", "the file (line 3, column 2): is not valid YAML"),
        ("config:\n  x: &r [*r]\n", "x[0] (line 2): an alias that contains itself"),
        (
            b"config:\n  x: \xff\xfe\n",
            "the file: is not UTF-8 text (byte 0xff at offset 13). Fix: save",
        ),
        ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), f"nests more than {MAX_DEPTH} levels deep"),
        ("x: " + "a" * 1_000_001, "bytes"),
    ],
    ids=[
        "duplicate-key",
        "date",
        "set",
        "binary",
        "merge-key",
        "unknown-tag",
        "yes",
        "on",
        "sexagesimal",
        "infinity",
        "complex-key",
        "file-a-list",
        "file-a-string",
        "config-a-list",
        "config-a-number",
        "broken-yaml",
        "bad-indentation",
        "recursive-alias",
        "not-utf8",
        "too-deep",
        "too-big",
    ],
)
def test_malformed_stack_files_are_refused_naming_where(tmp_path, text, expected):
    assert expected in refusal(tmp_path, text)


def test_an_alias_bomb_is_refused_before_it_expands(tmp_path):
    # 10^9 strings once expanded; the walk stops at its budget in well under a second.
    started = time.perf_counter()
    message = refusal(tmp_path, ALIAS_BOMB)
    assert time.perf_counter() - started < 2
    assert f"its aliases expand to more than {MAX_VALUES:,} values" in message


def test_plain_scalars_read_as_yaml_1_2_reads_them(tmp_path):
    path = tmp_path / "Pulumi.x.yaml"
    path.write_text(
        "\ufeffconfig:\n  a: 1\n  b: -2.5\n  c: true\n  d: False\n  e: ~\n  f: '2024-01-01'\n"
        '  g: "yes"\n  h: 1.36\n  i: "0x10"\n  j: |\n    text\n  k: &same [1]\n  l: *same\n  m:\n'
    )
    config = load_stack_file(path)["config"]
    assert config == {
        "a": 1,
        "b": -2.5,
        "c": True,
        "d": False,
        "e": None,
        "f": "2024-01-01",
        "g": "yes",
        "h": 1.36,
        "i": "0x10",
        "j": "text\n",
        "k": [1],
        "l": [1],
        "m": None,
    }


def test_an_empty_file_is_a_stack_without_config(tmp_path):
    path = tmp_path / "Pulumi.x.yaml"
    path.write_text("# nothing yet\n")
    assert load_stack_file(path) == {}


@pytest.mark.parametrize("value", ["aws", "{a: 1}", "[aws, 3]"])
def test_disable_default_providers_must_be_a_list_of_names(tmp_path, value):
    path = tmp_path / "Pulumi.x.yaml"
    path.write_text(f"config:\n  pulumi:disable-default-providers: {value}\n")
    with pytest.raises(ConfigError, match=r"providers: is a \w+. Fix: list package names"):
        stack_config(path)


def test_a_stack_name_that_is_no_file_lists_the_stacks():
    with pytest.raises(StackNotFound, match=r"aws-ekz: no stack of that name .*stacks: aws-eks, aws-k3s"):
        stack_file("aws-ekz")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("dir", r"a directory; name a Pulumi\.<stack>\.yaml file"),
        ("missing/Pulumi.x.yaml", "no such file"),
        ("Pulumi.x.txt", "not a stack file; stack files are named Pulumi.<stack>.yaml"),
    ],
)
def test_paths_that_are_no_stack_file_are_refused(tmp_path, monkeypatch, name, expected):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dir").mkdir()
    (tmp_path / "Pulumi.x.txt").write_text("config: {}\n")
    with pytest.raises(StackNotFound, match=expected):
        stack_file(name)


def test_the_cli_answers_a_malformed_file_with_exit_2_and_one_problem(tmp_path, capsys):
    path = tmp_path / "Pulumi.x.yaml"
    path.write_text(ALIAS_BOMB)
    assert main([str(path), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 2 and "aliases expand" in captured.err


def test_a_project_without_its_program_is_told_what_to_write(tmp_path, capsys):
    (tmp_path / "Pulumi.yaml").write_text("name: mine\nruntime: python\nstackConfigDir: stacks\n")
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "Pulumi.dev.yaml").write_text("config: {}\n")
    assert main([str(tmp_path / "stacks" / "Pulumi.dev.yaml")]) == 2
    err = capsys.readouterr().err
    assert f"the project's program {tmp_path / '__main__.py'} does not exist" in err
    assert "Fix: write it; the whole program can be `from gpu_k8s import deploy_stack; deploy_stack()`" in err


def test_a_crash_exits_3_so_it_never_reads_as_a_changed_plan(monkeypatch, capsys):
    from gpu_k8s.tools import cli, plan

    def crash(argv):
        raise RuntimeError("boom")

    monkeypatch.setattr(plan, "main", crash)
    assert cli.main(["plan", "aws-eks", "--diff"]) == cli.INTERNAL_ERROR == 3
    err = capsys.readouterr().err
    assert "RuntimeError: boom" in err and "gpu-k8s plan: internal error (a bug" in err
