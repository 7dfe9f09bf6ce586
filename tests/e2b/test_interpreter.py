"""e2b-code-interpreter: state across runs, errors, contexts (Python and JavaScript)."""

import pytest


def test_state_persists_and_results(code_sandbox):
    first = code_sandbox.run_code("x = 41\nprint('set', x)")
    assert first.logs.stdout == ["set 41\n"]
    assert first.error is None
    second = code_sandbox.run_code("x + 1")
    assert second.text == "42"
    assert second.results[0].is_main_result is True
    assert second.execution_count > first.execution_count


def test_errors_are_reported(code_sandbox):
    ex = code_sandbox.run_code("import sys\nprint('before', file=sys.stderr)\n1 / 0")
    assert ex.error.name == "ZeroDivisionError"
    assert "division by zero" in ex.error.value
    assert "ZeroDivisionError" in ex.error.traceback
    assert ex.logs.stderr == ["before\n"]


def test_contexts_are_separate(code_sandbox):
    ctx = code_sandbox.create_code_context()
    assert ctx.language == "python" and ctx.id
    code_sandbox.run_code("only_here = 'ctx'", context=ctx)
    assert code_sandbox.run_code("only_here", context=ctx).text == "'ctx'"
    assert code_sandbox.run_code("only_here").error.name == "NameError"
    assert ctx.id in {c.id for c in code_sandbox.list_code_contexts()}
    code_sandbox.restart_code_context(ctx)
    assert code_sandbox.run_code("only_here", context=ctx).error.name == "NameError"
    code_sandbox.remove_code_context(ctx)
    assert ctx.id not in {c.id for c in code_sandbox.list_code_contexts()}


def test_javascript(code_sandbox):
    ex = code_sandbox.run_code("const a = 20; a + 22", language="javascript")
    assert ex.error is None
    assert ex.text == "42"
    assert code_sandbox.run_code("a * 2", language="js").text == "40"


def test_unsupported_language_is_an_error(code_sandbox):
    with pytest.raises(Exception) as e:
        code_sandbox.run_code("print(1)", language="r")
    assert "not available" in str(e.value)
