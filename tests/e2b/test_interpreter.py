"""e2b-code-interpreter: state across runs, errors, contexts (Python, JavaScript and bash)."""

import threading
import time

import pytest
from e2b import TimeoutException
from e2b_code_interpreter import Sandbox as CodeSandbox


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
    assert code_sandbox.run_code("only_here", context=ctx).text == "ctx"
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
        code_sandbox.run_code("print(1)", language="cobol")
    assert "not available" in str(e.value)


def test_interpreter_output_streams_while_running(code_sandbox):
    first_at = []
    started = time.monotonic()
    execution = code_sandbox.run_code(
        "import time\nprint('a', flush=True)\ntime.sleep(1.5)\nprint('b')",
        on_stdout=lambda m: first_at.append(time.monotonic() - started))
    assert first_at and first_at[0] < 1.0, first_at
    assert "".join(execution.logs.stdout) == "a\nb\n"


def test_string_results_come_without_their_quotes(code_sandbox):
    # As E2B's interpreter answers: the repr's quotes go, nothing else does.
    assert code_sandbox.run_code("'bar'").text == "bar"
    assert code_sandbox.run_code("['a', 'b']").text == "['a', 'b']"


def test_the_sandboxs_variables_reach_its_interpreter():
    sb = CodeSandbox.create(envs={"SANDBOX_WIDE": "everywhere"})
    try:
        assert sb.run_code("import os; os.getenv('SANDBOX_WIDE')").text == "everywhere"
        ex = sb.run_code("import os; os.getenv('SANDBOX_WIDE')", envs={"SANDBOX_WIDE": "run"})
        assert ex.text == "run"
        ctx = sb.create_code_context(cwd="/tmp")
        assert sb.run_code("import os; os.getenv('SANDBOX_WIDE')", context=ctx).text == "everywhere"
    finally:
        sb.kill()


def test_run_code_with_envs_for_that_run_only(code_sandbox):
    ex = code_sandbox.run_code("import os; os.environ['ONLY_THIS_RUN']", envs={"ONLY_THIS_RUN": "1"})
    assert ex.text == "1"
    ex = code_sandbox.run_code("import os; os.environ.get('ONLY_THIS_RUN')")
    assert ex.text is None


def test_context_in_another_directory(code_sandbox):
    ctx = code_sandbox.create_code_context(cwd="/tmp")
    assert ctx.cwd == "/tmp"
    ex = code_sandbox.run_code("import os; os.getcwd()", context=ctx)
    assert ex.text == "/tmp"


def test_a_run_whose_sandbox_is_killed_under_it_says_so():
    # The answer breaks off (as E2B's proxy cuts it); the SDK asks the sandbox's health, hears
    # it is gone and says the sandbox was killed, rather than returning an empty success.
    sb = CodeSandbox.create()
    timer = threading.Timer(1.0, sb.kill)
    timer.start()
    try:
        with pytest.raises(TimeoutException, match="sandbox was killed"):
            sb.run_code("import time; time.sleep(60)", timeout=60)
    finally:
        timer.cancel()


def test_default_contexts_exist_from_the_start_in_the_users_home(code_sandbox):
    # As E2B's: a Python and a JavaScript context before any run, both in /home/user, and the
    # runs without a context go to them.
    contexts = code_sandbox.list_code_contexts()
    defaults = [(c.language, c.cwd) for c in contexts[:2]]
    assert defaults == [("python", "/home/user"), ("javascript", "/home/user")], contexts
    assert code_sandbox.run_code("import os; os.getcwd()").text == "/home/user"
    assert code_sandbox.run_code("process.cwd()", language="js").text == "/home/user"
    assert code_sandbox.create_code_context().cwd == "/home/user"
    again = code_sandbox.list_code_contexts()
    assert [c.id for c in again[: len(contexts)]] == [c.id for c in contexts], "defaults first"


def test_a_run_the_client_gave_up_on_is_interrupted(code_sandbox):
    # The SDK's timeout closes the connection; the run is interrupted (not left to block the
    # context) and the context keeps its state.
    code_sandbox.run_code("kept = 7")
    with pytest.raises(TimeoutException):
        code_sandbox.run_code("import time; time.sleep(300)", timeout=2)
    ex = code_sandbox.run_code("kept * 6", timeout=20)
    assert (ex.text, ex.error) == ("42", None)


def test_cells_as_jupyter_takes_them(code_sandbox):
    # Shell escapes and a cell indented as a whole (Python); ES imports and top-level await
    # with a value (JavaScript).
    assert "".join(code_sandbox.run_code("!pwd").logs.stdout) == "/home/user\n"
    ex = code_sandbox.run_code("""
        total = 0
        for i in range(4):
            total += i
        total
        """)
    assert (ex.text, ex.error) == ("6", None)
    ex = code_sandbox.run_code("import { join } from 'path'\nconsole.log(join('a', 'b'))", language="js")
    assert (ex.logs.stdout, ex.error) == (["a/b\n"], None)
    assert code_sandbox.run_code("await Promise.resolve('done')", language="js").text == "done"


@pytest.fixture
def wide_sandbox():
    """A code sandbox whose every context has SANDBOX_WIDE=everywhere in its environment."""
    with CodeSandbox.create(envs={"SANDBOX_WIDE": "everywhere"}) as sb:
        yield sb


def test_bash_is_a_long_lived_shell(wide_sandbox):
    sb = wide_sandbox
    ex = sb.run_code("cd /tmp; n=41; pwd; echo $SANDBOX_WIDE", language="bash")
    assert (ex.logs.stdout, ex.error) == (["/tmp\neverywhere\n"], None)
    ex = sb.run_code("echo $((n + 1)) $FOO", language="bash", envs={"FOO": "bar"})
    assert ex.logs.stdout == ["42 bar\n"]
    assert sb.run_code("echo ${FOO:-unset}", language="bash").logs.stdout == ["unset\n"]
    ex = sb.run_code("false", language="bash")
    assert (ex.error.name, ex.error.value) == ("ExitCode", "1")
    ctx = sb.create_code_context(language="bash")
    assert sb.run_code("pwd", context=ctx).logs.stdout == ["/home/user\n"]


def test_typescript_runs_in_its_own_context_with_types_stripped(wide_sandbox):
    # As E2B's kernel: a JavaScript interpreter whose cells lose their types (unchecked).
    sb = wide_sandbox
    ex = sb.run_code("const message: string = 'Hello, World!'; console.log(message)", language="ts")
    assert (ex.logs.stdout, ex.error) == (["Hello, World!\n"], None)
    assert sb.run_code("process.cwd()", language="typescript").text == "/home/user"
    ex = sb.run_code(
        "interface Box<T> { v: T }\nconst b: Box<number> = { v: 41 }\nb.v + 1", language="ts")
    assert ex.text == "42"
    assert sb.run_code("process.env.SANDBOX_WIDE as string", language="ts").text == "everywhere"
    ex = sb.run_code("let broken: = 1", language="ts")
    assert ex.error.name == "SyntaxError"
    languages = [c.language for c in sb.list_code_contexts()]
    assert (languages.count("typescript"), languages.count("javascript")) == (1, 1)
    assert sb.run_code("typeof b", language="js").text == "undefined", "a context of its own"


def test_java_is_jshell_with_the_environment_as_properties(wide_sandbox):
    sb = wide_sandbox
    ex = sb.run_code('System.getProperty("user.dir")', language="java")
    assert (ex.text, ex.error) == ("/home/user", None)
    ex = sb.run_code(
        'int n = 41;\nSystem.out.println(System.getProperty("SANDBOX_WIDE"));', language="java"
    )
    assert (ex.logs.stdout, ex.error) == (["everywhere\n"], None)
    ex = sb.run_code('n + 1 + System.getProperty("FOO")', language="java", envs={"FOO": "bar"})
    assert ex.text == "42bar"
    assert sb.run_code('System.getProperty("FOO", "unset")', language="java").text == "unset"
    ex = sb.run_code('Object o = null; o.toString()', language="java")
    assert ex.error.name == "java.lang.NullPointerException"
    assert [c.language for c in sb.list_code_contexts()].count("java") == 1


def test_r_is_one_session_printing_as_its_prompt_does(wide_sandbox):
    sb = wide_sandbox
    ex = sb.run_code("getwd()", language="r")
    assert (ex.results[0].text, ex.error) == ('[1] "/home/user"', None)
    ex = sb.run_code('x <- 41\nprint(Sys.getenv("SANDBOX_WIDE"))', language="r")
    assert (ex.logs.stdout, ex.error) == (['[1] "everywhere"\n'], None)
    ex = sb.run_code('paste(x + 1, Sys.getenv("FOO"))', language="r", envs={"FOO": "bar"})
    assert ex.text == '[1] "42 bar"'
    assert sb.run_code('Sys.getenv("FOO", "unset")', language="r").text == '[1] "unset"'
    ex = sb.run_code("stop('boom')", language="r")
    assert (ex.error.name, ex.error.value) == ("Error", "boom")
    # A plot is a PNG result, as IRkernel shows it, before the value; nothing on stderr.
    ex = sb.run_code("plot(1:3, main = 'three')\nx", language="r")
    assert (len(ex.results), ex.error, ex.logs.stderr) == (2, None, []), ex
    assert ex.results[0].png and ex.results[1].text == "[1] 41"


def test_figures_come_with_the_chart_they_draw(code_sandbox):
    from e2b_code_interpreter.charts import BarChart, LineChart, SuperChart

    ex = code_sandbox.run_code(
        "import matplotlib.pyplot as plt\nplt.bar(['A', 'B'], [1, 2], label='n')\n"
        "plt.xlabel('Who'); plt.ylabel('Count (books)'); plt.title('T')\nplt.show()")
    chart = ex.results[0].chart
    assert isinstance(chart, BarChart), ex.results[0]
    assert (chart.title, chart.x_label, chart.y_unit) == ("T", "Who", "books")
    assert [(b.label, b.value, b.group) for b in chart.elements] == [("A", 1, "n"), ("B", 2, "n")]
    assert {"png", "chart"} <= set(ex.results[0].formats())
    ex = code_sandbox.run_code(
        "fig, axs = plt.subplots(1, 2); fig.suptitle('S')\n"
        "axs[0].plot([1, 2], label='up'); axs[1].plot([2, 1]); plt.show()")
    chart = ex.results[0].chart
    assert isinstance(chart, SuperChart) and chart.title == "S"
    assert all(isinstance(c, LineChart) for c in chart.elements)
    assert chart.elements[0].elements[0].points == [(0.0, 1.0), (1.0, 2.0)]


def test_pil_images_shown_or_saved_are_results(code_sandbox):
    # As in E2B's kernels: a sandbox has no image viewer, so show() displays the image, and
    # so does saving it to a file.
    ex = code_sandbox.run_code(
        "from PIL import Image\nim = Image.new('RGB', (4, 4))\nim.show()\n"
        "im.save('/tmp/shown.png')\nprint('done')")
    assert (ex.error, ex.logs.stdout) == (None, ["done\n"])
    assert len([r for r in ex.results if r.png]) == 2, ex.results


def test_rich_formats_as_e2b_names_them(code_sandbox):
    # A DataFrame's columns come as `data` beside its html and text; LaTeX and JPEG
    # representations as `latex` and `jpeg`.
    ex = code_sandbox.run_code('import pandas as pd\npd.DataFrame({"a": [1, 2, 3]})')
    frame = ex.results[0]
    assert frame.data == {"a": [1, 2, 3]}
    assert frame.html and "<table" in frame.html and frame.text
    ex = code_sandbox.run_code(
        "class F:\n    def _repr_latex_(self): return r'$x$'\n"
        "    def _repr_jpeg_(self): return b'\\xff\\xd8'\nF()")
    assert (ex.results[0].latex, ex.results[0].jpeg) == ("$x$", "/9g=")
    assert set(ex.results[0].formats()) >= {"latex", "jpeg", "text"}


def test_pdf_javascript_and_extra_formats(code_sandbox):
    # `pdf` and `javascript` as E2B names them, a bundle's other MIME types (Plotly's) as
    # `extra`, each among the result's formats.
    ex = code_sandbox.run_code(
        "from IPython.display import Javascript\n"
        "class Doc:\n    def _repr_pdf_(self): return b'%PDF-1.4'\n"
        "class Plot:\n    def _repr_mimebundle_(self, **kw):\n"
        "        return {'application/vnd.plotly.v1+json': {'data': []}, 'text/plain': 'plot'}\n"
        "display(Doc(), Javascript('console.log(1)'))\nPlot()")
    doc, script, plot = ex.results
    assert (doc.pdf, script.javascript) == ("JVBERi0xLjQ=", "console.log(1)")
    assert plot.extra == {"application/vnd.plotly.v1+json": {"data": []}}
    assert "pdf" in doc.formats() and "javascript" in script.formats()
    assert "application/vnd.plotly.v1+json" in plot.formats() and plot.text == "plot"


def test_plotly_figures_are_results(code_sandbox):
    # As in E2B's kernels, not a browser window: Plotly's JSON and HTML drawing it.
    ex = code_sandbox.run_code(
        "import plotly.graph_objects as go\n"
        "go.Figure(go.Scatter(x=[1, 2], y=[3, 4])).show()")
    (shown,) = ex.results
    assert shown.extra["application/vnd.plotly.v1+json"]["data"][0]["y"] == [3, 4]
    assert "Plotly.newPlot" in shown.html and "html" in shown.formats()


def test_ipython_magics_without_ipython(code_sandbox):
    # Notebook code as E2B's IPython kernels take it.
    ex = code_sandbox.run_code("%matplotlib inline\n%cd /tmp\nfiles = !ls /\n'tmp' in files")
    assert (ex.error, ex.logs.stdout, ex.text) == (None, ["/tmp\n"], "True"), ex
    ex = code_sandbox.run_code("%%writefile notes.txt\nhello\n")
    assert ex.logs.stdout == ["Writing notes.txt\n"], ex
    ex = code_sandbox.run_code("%%bash\ncat /tmp/notes.txt")
    assert ex.logs.stdout == ["hello\n"], ex
    ex = code_sandbox.run_code("%load_ext nothing")
    assert ex.error.name == "ModuleNotFoundError", ex
    # Back where it was, quietly, for the tests after this one.
    ex = code_sandbox.run_code("%cd -q -\nimport os\nos.getcwd() != '/tmp'")
    assert (ex.logs.stdout, ex.text) == ([], "True"), ex


def test_capture_hides_an_install_and_pip_needs_no_percent(code_sandbox):
    # How notebooks hide an install's noise; `pip ...` without `%` is IPython's automagic.
    ex = code_sandbox.run_code("%%capture out\n!echo noisy\npip show pip\n7")
    assert (ex.error, ex.logs.stdout, ex.results) == (None, [], []), ex
    ex = code_sandbox.run_code("out.stdout.splitlines()[:2], out.outputs[0].data")
    assert ex.text == "(['noisy', 'Name: pip'], {'text/plain': '7'})", ex


def test_ijavascript_api(code_sandbox):
    # E2B's JavaScript kernel is IJavascript: `$$` sends the run's result in a MIME type.
    ex = code_sandbox.run_code("$$.html('<b>x</b>')", language="js")
    assert (ex.error, len(ex.results), ex.results[0].html) == (None, 1, "<b>x</b>"), ex
    ex = code_sandbox.run_code(
        "$$.async()\nsetTimeout(() => $$.sendResult({ready: true}), 20)", language="js")
    assert ex.results[0].json == {"ready": True}, ex


def test_ipython_display_without_ipython(code_sandbox):
    # E2B's own check (test_custom_repr_object): a raw MIME bundle shown through IPython's API.
    ex = code_sandbox.run_code(
        "from IPython.display import display, Markdown\n"
        "display({'text/latex': r'\\text{CustomReprObject}'}, raw=True)\n"
        "display(Markdown('**m**'))")
    assert ex.results[0].formats() == ["latex"], ex
    assert ex.results[1].markdown == "**m**", ex
