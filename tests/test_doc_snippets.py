"""The documentation runs as written (issue 23, point 5; issue 32, point 4): every ```python
block of README.md and docs/*.md runs, standalone, twice in the same empty temporary directory
(the second run finds what the first one wrote: a checkpoint folder, shard files), as a user
runs a script from the page. Every relative link leads to a file that exists; every command
line of a ```bash block that starts with `.venv/bin/`, `bash launch/` or `dist-resume` names a
file, module or command that exists; every page whose snippet imports an optional package
names the extra that installs it.

How a block runs is said by an HTML comment on the line directly above its fence (the
markers are documented in docs/testing.md):

- no marker: `python snippet.py`, as the single process of a torchrun job would run it
  (RANK=0, WORLD_SIZE=1, MASTER_ADDR/PORT set), so that a training script's
  `dist.init_process_group("gloo")` runs as written. It is forked from a server that has
  imported torch (tests/script_processes.py); otherwise it is its own process.
- `<!-- run with: torchrun --nproc-per-node N -->`: `torchrun --nproc-per-node N snippet.py`,
  on 127.0.0.1.
- `<!-- not run: <reason> -->`: a fragment that is not a program, or a program that needs what
  the suite lacks (S3, a GPU); the reason is required.

No block is left out otherwise: a marker that is not directly above a ```python fence, a
marker of another form, and a Python block fenced in another way (```py, ~~~) fail the
tests. The pages are read when the tests are collected: docs files that other branches add
are checked as soon as they are present, none is listed by name here."""

from __future__ import annotations

import ast
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from importlib.metadata import packages_distributions, requires
from pathlib import Path

import pytest

from tests.doc_blocks import ROOT, TORCHRUN, Block, blocks, pages
from tests.script_processes import ScriptProcess

SNIPPET_TIMEOUT = 300  # seconds per run; a snippet takes a few on an idle machine, torchrun's under 20
ANY_MARKER = re.compile(r"<!--\s*(not[ -]?run|run[ -]?with|run)\b", re.IGNORECASE)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
COMMAND_STARTS = (".venv/bin/", "bash launch/", "dist-resume")
OTHER_PYTHON_FENCE = re.compile(r"^(```\s*(py|python3|pycon|ipython|{\.?python})\b|~~~)", re.IGNORECASE)


ALL_BLOCKS = [block for page in pages() for block in blocks(page)]
PYTHON = [block for block in ALL_BLOCKS if block.language == "python"]
RUN = [block for block in PYTHON if block.not_run is None]

PARALLEL = 2  # snippets run at once


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _snippet_env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)  # the snippet sees the installed package, as a user's script does
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo on loopback only
    return env


def _run_python(script: Path, log: Path) -> int | None:
    env = {**_snippet_env(), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    process = ScriptProcess(script.name, [], env, log, cwd=script.parent)
    try:
        return process.wait(timeout=SNIPPET_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return None


def _run_torchrun(script: Path, log: Path, processes: int) -> int | None:
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={processes}",
               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{_free_port()}", "--max-restarts=0", script.name]
    with open(log, "w") as out:
        # A session of its own, so that a timeout ends torchrun and every worker.
        process = subprocess.Popen(command, cwd=script.parent, env=_snippet_env(), stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        return process.wait(timeout=SNIPPET_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return None


def _run_twice(block: Block, directory: Path) -> list[tuple[int | None, str]]:
    """Each run's exit code (None: still running after SNIPPET_TIMEOUT, then killed) and
    output; the second run starts only once the first has passed, in the same folder."""
    folder = directory / "folder"  # the user's folder: the script and what it writes
    folder.mkdir(parents=True)
    script = folder / "snippet.py"
    script.write_text(block.text)
    runs: list[tuple[int | None, str]] = []
    for number in (1, 2):
        log = directory / f"run{number}.log"
        processes = block.processes
        code = _run_python(script, log) if processes is None else _run_torchrun(script, log, processes)
        runs.append((code, log.read_text()))
        if code != 0:
            break
    return runs


@pytest.fixture(scope="module")
def snippet_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Future]:
    """Every selected snippet, started PARALLEL at a time when the first of them is tested."""
    selected = [item.callspec.params["block"] for item in request.session.items
                if hasattr(item, "callspec") and isinstance(item.callspec.params.get("block"), Block)]
    root = tmp_path_factory.mktemp("snippets")
    pool = ThreadPoolExecutor(PARALLEL)
    request.addfinalizer(pool.shutdown)
    return {block.name: pool.submit(_run_twice, block, root / f"snippet{number}")
            for number, block in enumerate(selected)}


@pytest.mark.slow
@pytest.mark.parametrize("block", RUN, ids=lambda b: b.name)
def test_python_snippet_runs_twice_as_written(block: Block, snippet_runs: dict[str, Future]) -> None:
    how = "python snippet.py" if block.processes is None else f"torchrun --nproc-per-node {block.processes} snippet.py"
    runs = snippet_runs[block.name].result()
    for number, (code, output) in enumerate(runs, 1):
        outcome = f"did not end within {SNIPPET_TIMEOUT} s" if code is None else f"exit code {code}"
        which = "the first run" if number == 1 else "the second run, in the folder the first one left"
        assert code == 0, f"{block.name} ({how}) failed in {which} ({outcome}):\n{output}"
    assert len(runs) == 2


def test_every_marker_says_how_and_stands_above_a_python_block() -> None:
    """A block is left out only by a `not run` marker with its reason, directly above its
    fence; a torchrun marker names the number of processes; a marker anywhere else, or of
    another form, is an error rather than a block silently run another way or not at all."""
    assert [block.name for block in PYTHON if block.not_run == ""] == []
    assert [block.name for block in PYTHON if block.marker and block.marker[0] == "run with"
            and not TORCHRUN.fullmatch(block.marker[1])] == []
    placed = {(block.page, block.line - 1) for block in PYTHON if block.marker}
    stray = [f"{page.relative_to(ROOT)}:{number}: {line.strip()}" for page in pages()
             for number, line in enumerate(page.read_text().splitlines(), 1)
             if ANY_MARKER.match(line.strip()) and (page, number) not in placed]
    assert stray == [], "markers stand on the line directly above a ```python fence, as `<!-- not run: <reason> -->` " \
                        "or `<!-- run with: torchrun --nproc-per-node N -->`"
    others = [f"{page.relative_to(ROOT)}:{number}: {line.strip()}" for page in pages()
              for number, line in enumerate(page.read_text().splitlines(), 1) if OTHER_PYTHON_FENCE.match(line)]
    assert others == [], "Python blocks are fenced ```python, or the tests would not run them"


def _extras() -> dict[str, set[str]]:
    """Top-level module -> the extras that install it, for every optional part: the extras
    of the installed dist-resume (pyproject.toml's) but the project's own test and bench."""
    wanted: dict[str, set[str]] = {}
    for requirement in requires("dist-resume") or []:
        extra = re.search(r"""extra\s*==\s*["']([\w.-]+)["']""", requirement)
        name = re.split(r"[\[<>=!~;\s]", requirement, maxsplit=1)[0].lower().replace("_", "-")
        if extra and extra.group(1) not in ("test", "bench") and name != "dist-resume":
            wanted.setdefault(name, set()).add(extra.group(1))
    modules: dict[str, set[str]] = {}
    for module, names in packages_distributions().items():
        for name in names:
            modules.setdefault(module, set()).update(wanted.get(name.lower().replace("_", "-"), set()))
    return {module: extras for module, extras in modules.items() if extras}


def _imports(text: str) -> set[str]:
    try:
        tree = ast.parse(text)
    except SyntaxError:  # a fragment: its import lines are still imports
        return set(re.findall(r"^\s*(?:from|import)\s+(\w+)", text, re.MULTILINE))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


# What needs an extra without importing its package in the snippet: dist_resume's parts that
# import it when used, and S3 URLs (fsspec finds s3fs).
USES_AN_EXTRA = {r"\bParquetReader\b": "parquet", r"\bhf_stream\b": "datasets", r"""["']s3://""": "s3"}


def _needed_extras(block: Block, modules: dict[str, set[str]]) -> list[set[str]]:
    """What the block needs, each as the extras any of which installs it."""
    needed = [modules[name] for name in sorted(_imports(block.text)) if name in modules]
    return needed + [{extra} for pattern, extra in USES_AN_EXTRA.items() if re.search(pattern, block.text)]


def test_pages_name_the_extra_their_snippets_need() -> None:
    """A page whose snippet needs a package of an extra (lightning, pyarrow, ...) says how to
    install it: `dist-resume[<extra>]`, alone or with other extras, somewhere on the page."""
    modules = _extras()
    assert {"s3", "parquet", "lightning", "accelerate", "transformers", "datasets"} <= set().union(*modules.values())
    missing = []
    for page in pages():
        text = page.read_text()
        named = {extra for group in re.findall(r"dist-resume\[([\w,\s-]+)\]", text) for extra in re.split(r"[,\s]+", group)}
        for block in (block for block in PYTHON if block.page == page):
            missing += [f"{block.name}: dist-resume[{' or '.join(sorted(extras))}]"
                        for extras in _needed_extras(block, modules) if not extras & named]
    assert not missing, "pages that do not name the extra their snippet needs:\n" + "\n".join(missing)


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
