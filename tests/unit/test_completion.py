"""`servestack completion bash|zsh|fish`, run as a user runs it: the bash script is valid bash and completes as
bash would (COMP_WORDS set, the completion function called); the zsh and fish scripts offer every subcommand."""

from __future__ import annotations

import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from servestack.cli.main import COMMANDS

SERVESTACK = str(Path(sys.executable).parent / "servestack")


@cache
def completion(shell: str) -> str:
    done = subprocess.run([SERVESTACK, "completion", shell], capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


def groups_and_leaves() -> dict[str, set[str]]:
    """What each command path offers ("" the top): its subcommands' names, from the command table."""
    offered: dict[str, set[str]] = {"": set()}
    for command in COMMANDS:
        offered[""].add(command.words[0])
        if len(command.words) == 2:
            offered.setdefault(command.words[0], set()).add(command.words[1])
    return offered


def bash_completes(*words: str, cwd: Path | None = None) -> list[str]:
    """What bash offers after `servestack WORDS` (the last word is the one being completed)."""
    line = shlex.join(["servestack", *words])
    program = (
        f"{completion('bash')}\n"
        f"COMP_WORDS=({line}); COMP_CWORD={len(words)}; COMP_LINE={shlex.quote(line)}; _servestack\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=30, check=True, cwd=cwd)
    return [item for item in done.stdout.splitlines() if item]


def test_the_bash_script_is_valid_bash() -> None:
    done = subprocess.run(["bash", "-n"], input=completion("bash"), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def test_bash_completes_every_subcommand_at_every_level() -> None:
    for path, names in groups_and_leaves().items():
        words = [*path.split(), ""]
        assert set(bash_completes(*words)) == names, path
    assert bash_completes("loc") == ["local"]
    assert bash_completes("models", "pro") == ["promote"]


def test_bash_completes_options_their_choices_and_files(tmp_path: Path) -> None:
    assert set(bash_completes("loadtest", "--con")) == {"--content-type", "--concurrency"}
    assert "--visibility-timeout-sec" in bash_completes("local", "up", "--")
    assert bash_completes("local", "deploy", "digits-realtime", "--strategy", "") == ["canary", "linear", "all_at_once"]
    assert bash_completes("completion", "") == ["bash", "zsh", "fish"]
    # a Path option completes files; an option taking a number offers nothing
    (tmp_path / "sample-request.json").write_text("{}")
    assert bash_completes("invoke", "digits-api", "--data", "sam", cwd=tmp_path) == ["sample-request.json"]
    assert bash_completes("local", "up", "--port", "", cwd=tmp_path) == []


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_offer_every_subcommand_with_its_help(shell: str) -> None:
    script = completion(shell)
    for command in COMMANDS:
        name = command.words[-1]
        offered = f"'{name}:" if shell == "zsh" else f"-a {name} -d "
        assert offered in script, (shell, command.words)
    # a group's subcommands are offered under the group only
    if shell == "fish":
        assert "-n 'test (__servestack_path) = \\'servestack local\\'' -a up -d " in script
    else:
        assert '"local")\n            commands=(' in script
        assert "compdef _servestack servestack" in script


def test_an_unknown_shell_is_refused_naming_the_known_ones() -> None:
    done = subprocess.run([SERVESTACK, "completion", "tcsh"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("servestack completion: error: argument shell: invalid choice: 'tcsh'"), line
    assert all(shell in line for shell in ("bash", "zsh", "fish")), line
