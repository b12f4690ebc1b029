"""`servestack completion bash|zsh|fish`: a shell completion script generated from the argparse parser.

Generated here rather than by shtab or argcomplete: neither is a dependency, and the command tree is small
(groups, their subcommands, each one's options and choices), so a walk of the parser gives every shell what it
needs. The script is static: completing costs the shell no Python start-up, and a new subcommand or option
reaches it when the script is generated again.

Each shell finds where the user is the same way: the words typed so far that name subcommands make a path
("", "local", "local up"); the path gives the subcommands, options and positional choices to offer, and an
option that takes a value offers its choices, files (a `Path` option), or nothing.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

SHELLS = ("bash", "zsh", "fish")


@dataclass(frozen=True)
class Option:
    names: tuple[str, ...]
    help: str
    takes_value: bool
    choices: tuple[str, ...] = ()
    is_path: bool = False


@dataclass
class Node:
    """One command path: its subcommands (name -> help), options and positional choices."""

    path: str
    children: dict[str, str] = field(default_factory=dict)
    options: list[Option] = field(default_factory=list)
    positional_choices: tuple[str, ...] = ()


def command_tree(parser: argparse.ArgumentParser) -> list[Node]:
    """Every command path of `parser`, the top first."""
    nodes: list[Node] = []

    def walk(current: argparse.ArgumentParser, words: tuple[str, ...]) -> None:
        node = Node(" ".join(words))
        nodes.append(node)
        below: list[tuple[str, argparse.ArgumentParser]] = []
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
                for name, child in action.choices.items():
                    node.children[name] = helps.get(name, "")
                    below.append((name, child))
            elif action.option_strings:
                if action.help == argparse.SUPPRESS:
                    continue
                node.options.append(
                    Option(
                        tuple(action.option_strings),
                        _first_sentence(action.help),
                        action.nargs != 0,
                        tuple(str(c) for c in action.choices or ()),
                        action.type is Path,
                    )
                )
            elif action.choices:
                node.positional_choices += tuple(str(c) for c in action.choices)
        for name, child in below:
            walk(child, (*words, name))

    walk(parser, ())
    return nodes


def _first_sentence(text: str | None) -> str:
    """A short description: help up to its first ';' or '(' and at most 80 characters, no format fields."""
    plain = (text or "").replace("%(default)s", "").replace("%%", "%")
    for stop in (";", " ("):
        plain = plain.split(stop, 1)[0]
    return plain.strip()[:80]


def script(shell: str, parser: argparse.ArgumentParser, program: str = "servestack") -> str:
    if shell not in SHELLS:
        raise ValueError(f"shell: {shell!r} is not one of {', '.join(SHELLS)}")
    nodes = command_tree(parser)
    return {"bash": _bash, "zsh": _zsh, "fish": _fish}[shell](nodes, program)


def _pairs(nodes: list[Node]) -> list[str]:
    """ "path:child" for every subcommand, the test that extends a path by a word."""
    return [f"{node.path}:{child}" for node in nodes for child in node.children]


def _value_cases(nodes: list[Node]) -> list[tuple[str, str, Option]]:
    """(path, option name, option) for every option that takes a value."""
    return [(node.path, name, option) for node in nodes for option in node.options if option.takes_value
            for name in option.names]  # fmt: skip


# ------------------------------------------------------------------------------------------ bash


def _bash(nodes: list[Node], program: str) -> str:
    function = f"_{program.replace('-', '_')}"
    children = "\n".join(f'        "{n.path}") echo "{" ".join(n.children)}" ;;' for n in nodes if n.children)
    options = "\n".join(
        f'        "{n.path}") echo "{" ".join(o for opt in n.options for o in opt.names)}" ;;' for n in nodes
    )
    choices = "\n".join(
        f'        "{n.path}") echo "{" ".join(n.positional_choices)}" ;;' for n in nodes if n.positional_choices
    )
    values = []
    for path, name, option in _value_cases(nodes):
        offer = " ".join(option.choices) if option.choices else "@files" if option.is_path else "@any"
        values.append(f'        "{path}|{name}") echo "{offer}" ;;')
    pairs = "|".join(f'"{pair}"' for pair in _pairs(nodes))
    value_cases = "\n".join(values)
    return f"""# bash completion for {program}: eval "$({program} completion bash)" in ~/.bashrc, or save it as
# ~/.local/share/bash-completion/completions/{program}
{function}_children() {{
    case "$1" in
{children}
    esac
}}

{function}_options() {{
    case "$1" in
{options}
    esac
}}

{function}_choices() {{
    case "$1" in
{choices}
    esac
}}

{function}_values() {{
    case "$1|$2" in
{value_cases}
    esac
}}

{function}() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="" at="" word i offer
    if ((COMP_CWORD > 1)); then prev="${{COMP_WORDS[COMP_CWORD - 1]}}"; fi
    for ((i = 1; i < COMP_CWORD; i++)); do
        word="${{COMP_WORDS[i]}}"
        case "$at:$word" in
            {pairs}) at="${{at:+$at }}$word" ;;
        esac
    done
    offer="$({function}_values "$at" "$prev")"
    case "$offer" in
        "@files") compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -f -- "$cur")); return ;;
        "@any") COMPREPLY=(); return ;;
        ?*) COMPREPLY=($(compgen -W "$offer" -- "$cur")); return ;;
    esac
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$({function}_options "$at")" -- "$cur"))
    else
        COMPREPLY=($(compgen -W "$({function}_children "$at") $({function}_choices "$at")" -- "$cur"))
    fi
}}

complete -F {function} {program}
"""


# ------------------------------------------------------------------------------------------ zsh


def _zsh_item(name: str, text: str) -> str:
    described = f"{name.replace(':', chr(92) + ':')}:{text.replace(':', chr(92) + ':')}"
    return "'" + described.replace("'", "'\\''") + "'"


def _zsh(nodes: list[Node], program: str) -> str:
    function = f"_{program.replace('-', '_')}"
    values = []
    for path, name, option in _value_cases(nodes):
        action = ":"  # a value to type: nothing to offer
        if option.choices:
            action = f"compadd -- {' '.join(option.choices)}"
        elif option.is_path:
            action = "_files"
        values.append(f'        "{path}|{name}") {action}; return ;;')
    listings = []
    for node in nodes:
        commands = " ".join(_zsh_item(name, text) for name, text in node.children.items())
        options = " ".join(_zsh_item(name, o.help) for o in node.options for name in o.names)
        choices = " ".join(node.positional_choices)
        listings.append(
            f'        "{node.path}")\n'
            f"            commands=({commands})\n"
            f"            options=({options})\n"
            f"            choices=({choices}) ;;"
        )
    pairs = "|".join(f'"{pair}"' for pair in _pairs(nodes))
    value_cases, listing_cases = "\n".join(values), "\n".join(listings)
    return f"""#compdef {program}
# zsh completion for {program}: save as _{program} in a folder of $fpath, or eval "$({program} completion zsh)"
# after compinit.
{function}() {{
    # `at`, not `path`: zsh ties $path to $PATH
    local at="" word i
    local -a commands options choices
    for ((i = 2; i < CURRENT; i++)); do
        word="${{words[i]}}"
        case "$at:$word" in
            {pairs}) at="${{at:+$at }}$word" ;;
        esac
    done
    case "$at|${{words[CURRENT-1]}}" in
{value_cases}
    esac
    case "$at" in
{listing_cases}
    esac
    if [[ "${{words[CURRENT]}}" == -* ]]; then
        _describe -t options option options
    else
        _describe -t commands command commands
        (( ${{#choices}} )) && compadd -- $choices
    fi
}}

if [[ "$funcstack[1]" == "{function}" ]]; then
    {function} "$@"
else
    compdef {function} {program}
fi
"""


# ------------------------------------------------------------------------------------------ fish


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish(nodes: list[Node], program: str) -> str:
    """Paths start with the program's name ("servestack local"): fish's `test` needs no empty-string case."""
    helper = f"__{program.replace('-', '_')}_path"
    cases = " ".join(_fish_quote(f"{program} {pair}".replace(f"{program} :", f"{program}:")) for pair in _pairs(nodes))
    lines = [
        f"# fish completion for {program}: {program} completion fish > ~/.config/fish/completions/{program}.fish",
        f"function {helper}",
        f"    set -l at {program}",
        "    for word in (commandline -opc)[2..-1]",
        '        switch "$at:$word"',
        f"            case {cases}",
        '                set at "$at $word"',
        "        end",
        "    end",
        '    echo "$at"',
        "end",
        "",
        f"complete -c {program} -f",
    ]
    for node in nodes:
        full = f"{program} {node.path}".strip()
        at = f"-n {_fish_quote(f'test ({helper}) = {_fish_quote(full)}')}"
        for name, text in node.children.items():
            lines.append(f"complete -c {program} {at} -a {name} -d {_fish_quote(text)}")
        if node.positional_choices:
            lines.append(f"complete -c {program} {at} -a {_fish_quote(' '.join(node.positional_choices))}")
        for option in node.options:
            flags = " ".join(f"-l {name[2:]}" if name.startswith("--") else f"-s {name[1:]}" for name in option.names)
            value = ""
            if option.takes_value:
                value = " -r -F" if option.is_path else " -x"
                if option.choices:
                    value = f" -x -a {_fish_quote(' '.join(option.choices))}"
            lines.append(f"complete -c {program} {at} {flags}{value} -d {_fish_quote(option.help)}")
    return "\n".join(lines) + "\n"
