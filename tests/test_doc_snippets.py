"""The documentation runs as written (issue 23, point 5): every ```python block of README.md
and docs/*.md runs, standalone, as a script of its own process from an empty temporary
directory (tests/script_processes.py: as `python snippet.py` would run it, forked from a
server that has imported torch); every relative link leads to a file that exists; every
command line of a ```bash block that starts with `.venv/bin/`, `bash launch/` or `dist-resume` names a file, module or
command that exists.

A python block that cannot run here (it needs several processes, S3, a GPU) is preceded by
the line `<!-- not run: <reason> -->`, with a reason. Each python block runs as the single
process of a torchrun job would (RANK=0, WORLD_SIZE=1, MASTER_ADDR/PORT set), so that a
training script's `dist.init_process_group("gloo")` runs as written.

The pages are read when the tests are collected: docs files that other branches add are
checked as soon as they are present, none is listed by name here."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.script_processes import ScriptProcess

ROOT = Path(__file__).resolve().parents[1]
SNIPPET_TIMEOUT = 120  # seconds; a snippet takes a few on an idle machine
NOT_RUN = re.compile(r"<!-- not run:(.*)-->")
FENCE = re.compile(r"^```(\w*)\s*$")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
COMMAND_STARTS = (".venv/bin/", "bash launch/", "dist-resume")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    not_run: str | None  # the reason given, None when the block runs

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(page: Path) -> list[Block]:
    found, lines = [], page.read_text().splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        marker = NOT_RUN.fullmatch(lines[index - 1].strip()) if index else None
        found.append(Block(page, index + 1, opening.group(1), "\n".join(lines[index + 1 : end]) + "\n",
                           marker.group(1).strip() if marker else None))
        index = end + 1
    return found


ALL_BLOCKS = [block for page in pages() for block in blocks(page)]
PYTHON = [block for block in ALL_BLOCKS if block.language == "python"]


PARALLEL = 2  # snippets run at once, one core each


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(block: Block, directory: Path) -> tuple[int | None, str]:
    """The snippet's exit code (None: still running after SNIPPET_TIMEOUT, then killed) and output."""
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    env.pop("PYTHONPATH", None)  # the snippet sees the installed package, as a user's script does
    directory.mkdir()
    script, log = directory / "snippet.py", directory / "output.log"
    script.write_text(block.text)
    process = ScriptProcess(str(script), [], env, log, cwd=directory)
    try:
        code = process.wait(timeout=SNIPPET_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        code = None
    return code, log.read_text()


@pytest.fixture(scope="module")
def snippet_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Future]:
    """Every selected snippet, started PARALLEL at a time when the first of them is tested."""
    selected = [item.callspec.params["block"] for item in request.session.items
                if hasattr(item, "callspec") and isinstance(item.callspec.params.get("block"), Block)]
    root = tmp_path_factory.mktemp("snippets")
    pool = ThreadPoolExecutor(PARALLEL)
    request.addfinalizer(pool.shutdown)
    return {block.name: pool.submit(_run, block, root / f"snippet{number}") for number, block in enumerate(selected)}


@pytest.mark.slow
@pytest.mark.parametrize("block", [b for b in PYTHON if b.not_run is None], ids=lambda b: b.name)
def test_python_snippet_runs_as_written(block: Block, snippet_runs: dict[str, Future]) -> None:
    code, output = snippet_runs[block.name].result()
    outcome = f"did not end within {SNIPPET_TIMEOUT} s" if code is None else f"exit code {code}"
    assert code == 0, f"{block.name} failed ({outcome}):\n{output}"


def test_every_skipped_snippet_says_why() -> None:
    skipped = [block for block in PYTHON if block.not_run is not None]
    assert [block.name for block in skipped if not block.not_run] == []
    marked = [(page, number) for page in pages() for number, line in enumerate(page.read_text().splitlines(), 1)
              if NOT_RUN.fullmatch(line.strip())]
    assert len(marked) == len(skipped), "a `not run` marker must stand directly above a ```python fence"


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation dropped, spaces
    made hyphens."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    headings = re.findall(r"^#+ (.+)$", text, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def test_relative_links_lead_to_files_and_headings() -> None:
    """Links to pages that other branches add fail here until those pages are present."""
    missing = []
    for page in pages():
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
        for target in LINK.findall(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # a web address
            path, _, anchor = target.partition("#")
            linked = page.parent / path if path else page
            if not linked.exists():
                missing.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                missing.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not missing, "links that lead nowhere:\n" + "\n".join(missing)


def _command_lines() -> list[tuple[str, list[str]]]:
    commands = []
    for block in ALL_BLOCKS:
        if block.language not in ("bash", "sh", "console"):
            continue
        for line in block.text.replace("\\\n", " ").splitlines():
            for command in re.split(r"&&|\|\||;|\|", line):
                words = shlex.split(command, comments=True)
                while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
                    words = words[1:]  # VAR=value before the command
                if words and " ".join(words).startswith(COMMAND_STARTS):
                    commands.append((f"{block.name}: {command.strip()}", words))
    return commands


def _subcommand_exists(name: str) -> bool:
    result = subprocess.run([sys.executable, "-m", "dist_resume", name, "--help"], capture_output=True,
                            check=False, timeout=SNIPPET_TIMEOUT)
    return result.returncode == 0


def _module_exists(module: str) -> bool:
    parts = module.split(".")
    if (ROOT.joinpath(*parts).with_suffix(".py")).exists() or (ROOT.joinpath(*parts) / "__init__.py").exists():
        return True
    result = subprocess.run([sys.executable, "-c", f"import importlib.util as u; exit(u.find_spec({module!r}) is None)"],
                            capture_output=True, check=False, timeout=SNIPPET_TIMEOUT)
    return result.returncode == 0


def _problems(words: list[str], subcommands: dict[str, bool]) -> list[str]:
    """What in one command line names nothing that exists."""
    program, args = words[0], words[1:]
    problems = []
    if program == "bash":
        program, args = args[0], args[1:]
        if not (ROOT / program).is_file():
            problems.append(f"no script {program}")
    elif program.startswith(".venv/bin/"):
        tool = program.removeprefix(".venv/bin/")
        if tool not in ("python", "python3", "pip", "dist-resume"):
            problems.append(f"{program} is not made by the quick start's venv")
        if tool == "dist-resume":
            program = "dist-resume"
        elif tool.startswith("python") and args[:1] == ["-m"] and len(args) > 1:
            if not _module_exists(args[1]):
                problems.append(f"no module {args[1]}")
        elif tool.startswith("python") and args and not args[0].startswith("-") and not (ROOT / args[0]).is_file():
            problems.append(f"no file {args[0]}")
    if program == "dist-resume":
        name = args[0] if args else "--help"
        if name not in subcommands:
            subcommands[name] = _subcommand_exists(name)
        if not subcommands[name]:
            problems.append(f"no command dist-resume {name}")
    for arg in args:
        if re.fullmatch(r"[\w./-]+\.(py|sh)", arg) and not (ROOT / arg).is_file():
            problems.append(f"no file {arg}")
    return list(dict.fromkeys(problems))


def test_documented_commands_name_what_exists() -> None:
    subcommands: dict[str, bool] = {}
    commands = _command_lines()
    assert commands, "the README's quick start has command lines"
    broken = [f"{where}: {problem}" for where, words in commands for problem in _problems(words, subcommands)]
    assert broken == []
