"""The test suite cannot hang: every wait on a subprocess, pipe or socket in tests/ has a deadline, and
pytest-timeout ends any test that still runs past the ceiling pyproject.toml sets.

Why: run from a background shell job (`cmd &`, nohup, some CI runners) a child starts with SIGINT ignored;
a server test that sent SIGINT and read the server's stderr without a deadline never ended. The check
reads every test file's syntax tree (as tests/test_imports.py does), so a new unbounded wait fails here,
in a second, instead of hanging CI for its 90 minutes.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
PIPES = ("stdout", "stderr")


def unbounded_waits(source: str) -> list[tuple[int, str]]:
    """(line, call) of every wait in `source` that has no deadline:
    subprocess.run / check_output / check_call / call, communicate() and urlopen() without timeout=;
    wait(), join() and get() without a timeout (a process, thread, event or queue); socket.create_connection
    without a timeout, recv() / accept() in a file that never calls settimeout; and a read of a child's
    stdout or stderr (readline(), read(), `for line in p.stdout`) outside a reader thread (tests/pipe_lines.py)."""
    tree = ast.parse(source)
    sets_timeouts = "settimeout" in source
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Attribute) and node.iter.attr in PIPES:
            found.append((node.lineno, f"for ... in {ast.unparse(node.iter)}"))
        if not isinstance(node, ast.Call):
            continue
        keywords = {k.arg for k in node.keywords}
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        owner = ast.unparse(node.func.value) if isinstance(node.func, ast.Attribute) else ""
        bounded = "timeout" in keywords
        if owner == "subprocess" and name in ("run", "check_output", "check_call", "call"):
            problem = not bounded
        elif name == "communicate":
            problem = not bounded and len(node.args) < 2
        elif name == "urlopen":
            problem = not bounded and len(node.args) < 3
        elif name in ("wait", "join", "get"):
            problem = not bounded and not node.args and not node.keywords
        elif name == "create_connection":
            problem = not bounded and len(node.args) < 2
        elif name in ("recv", "accept"):
            problem = not sets_timeouts
        elif name in ("readline", "read", "readlines"):
            problem = isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Attribute) \
                and node.func.value.attr in PIPES
        else:
            problem = False
        if problem:
            found.append((node.lineno, ast.unparse(node)[:100]))
    return sorted(found)


def test_every_wait_in_the_tests_has_a_deadline():
    found = [f"{path.relative_to(TESTS.parent)}:{line}: {call}" for path in sorted(TESTS.rglob("*.py"))
             for line, call in unbounded_waits(path.read_text())]
    assert not found, ("waits without a deadline (add timeout=..., or read a child's output with "
                       "tests/pipe_lines.PipeLines):\n" + "\n".join(found))


def test_the_checker_finds_each_kind_of_unbounded_wait():
    source = "\n".join([
        "subprocess.run(['x'])", "subprocess.run(['x'], timeout=5)", "p.communicate()", "p.communicate(timeout=5)",
        "p.wait()", "p.wait(5)", "thread.join()", "thread.join(5)", "lines.get()", "lines.get(timeout=1)",
        "', '.join(names)", "config.get('key')", "urllib.request.urlopen(url)", "urllib.request.urlopen(url, timeout=5)",
        "p.stderr.readline()", "p.stdout.read()", "handle.read()", "for line in p.stderr:\n    pass",
        "sock.recv(10)", "socket.create_connection(('h', 1))"])
    assert [line for line, _ in unbounded_waits(source)] == [1, 3, 5, 7, 9, 13, 15, 16, 18, 20, 21]
    assert unbounded_waits("sock.settimeout(5)\nsock.recv(10)") == []


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is Python 3.11+")
def test_pytest_timeout_is_a_test_dependency_with_a_ceiling_per_test():
    import tomllib

    project = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())
    assert any(dep.startswith("pytest-timeout") for dep in project["project"]["optional-dependencies"]["test"])
    assert int(project["tool"]["pytest"]["ini_options"]["timeout"]) > 0
