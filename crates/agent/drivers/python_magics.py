# IPython's magics that notebook code uses, for images without IPython (prepended to the
# Python driver, like the chart reader).
#
# E2B's kernels are IPython, and code written for notebooks starts with `%matplotlib inline`,
# writes files with `%%writefile`, times with `%time`/`%timeit`. The driver rewrites a cell's
# magic lines into calls of these only when the cell is not Python as it is; a magic not here
# is IPython's own error (`UsageError`), not silently skipped.


class _KoderSList(list):
    """A shell command's output lines (`files = !ls`), with IPython's SList views."""

    @property
    def n(self):
        return "\n".join(self)

    @property
    def s(self):
        return " ".join(self)

    @property
    def l(self):  # noqa: E743 - IPython's name
        return list(self)

    @property
    def p(self):
        import pathlib

        return [pathlib.Path(x) for x in self]


def _koder_magics(namespace, evaluate, shell, display, inline_backend):
    """The line-magic, cell-magic and shell-capture functions for cells run in `namespace`:
    `evaluate(source, filename)` runs code as a cell does and returns its last value,
    `shell(command)` runs a command whose output is the cell's, `display` shows a MIME bundle,
    `inline_backend()` makes matplotlib draw into results again."""
    import math
    import os
    import runpy
    import shlex
    import subprocess
    import sys
    import time
    import timeit

    class UsageError(Exception):
        """IPython's name for a magic used wrongly or not known."""

    previous = []

    def duration(seconds):
        """A duration as IPython prints one: three significant digits, s/ms/µs/ns."""
        if seconds >= 60:
            minutes, rest = divmod(seconds, 60)
            return "%dmin %.0fs" % (minutes, rest)
        for name, scale in (("s", 1), ("ms", 1e3), ("\u00b5s", 1e6)):
            if seconds * scale >= 1:
                return "%.3g %s" % (seconds * scale, name)
        return "%.3g ns" % (seconds * 1e9)

    def cd(args):
        target = args.strip()
        quiet = target.startswith("-q")
        if quiet:
            target = target[2:].strip()
        if target == "-":
            if not previous:
                raise UsageError("%cd -: no previous directory")
            target = previous[-1]
        target = os.path.expanduser(target or "~")
        here = os.getcwd()
        try:
            os.chdir(target)
        except OSError as e:
            raise UsageError("%cd: " + str(e)) from None
        previous.append(here)
        if not quiet:
            print(os.getcwd())

    def env(args):
        args = args.strip()
        if not args:
            return dict(os.environ)
        if "=" in args or " " in args:
            name, _, value = args.partition("=" if "=" in args else " ")
            name, value = name.strip(), value.strip()
            if not name:
                raise UsageError("%env: a name before '='")
            os.environ[name] = value
            print("env: %s=%s" % (name, value))
            return None
        if args not in os.environ:
            raise UsageError("Environment does not have key: %s" % args)
        return os.environ[args]

    def timed(source, filename):
        """Runs `source` as a cell, prints IPython's CPU and wall times, returns its value."""
        before, wall = os.times(), time.perf_counter()
        try:
            return evaluate(source, filename)
        finally:
            after, wall = os.times(), time.perf_counter() - wall
            user, system = after.user - before.user, after.system - before.system
            print("CPU times: user %s, sys: %s, total: %s" % (
                duration(user), duration(system), duration(user + system)))
            print("Wall time: %s" % duration(wall))

    def timeit_options(args):
        """`-n N -r R` and the rest of a %timeit line."""
        number, repeat = None, 7
        words = args.strip().split(" ")
        while len(words) >= 2 and words[0] in ("-n", "-r"):
            try:
                value = int(words[1])
            except ValueError:
                raise UsageError("%timeit: " + words[0] + " takes a number") from None
            if value < 1:
                raise UsageError("%timeit: " + words[0] + " takes a positive number")
            if words[0] == "-n":
                number = value
            else:
                repeat = value
            words = words[2:]
        return number, repeat, " ".join(words).strip()

    def time_it(stmt, setup, number, repeat):
        if not stmt.strip():
            raise UsageError("%timeit: nothing to time")
        timer = timeit.Timer(stmt, setup or "pass", globals=namespace)
        if number is None:
            number, _ = timer.autorange()
        per_loop = [t / number for t in timer.repeat(repeat=repeat, number=number)]
        mean = sum(per_loop) / len(per_loop)
        spread = math.sqrt(sum((t - mean) ** 2 for t in per_loop) / len(per_loop))
        print("%s \u00b1 %s per loop (mean \u00b1 std. dev. of %d run%s, %s loop%s each)" % (
            duration(mean), duration(spread), repeat, "" if repeat == 1 else "s",
            "{:,}".format(number), "" if number == 1 else "s"))

    def timeit_line(args):
        number, repeat, stmt = timeit_options(args)
        time_it(stmt, "pass", number, repeat)

    def run_script(args):
        argv = shlex.split(args)
        if not argv:
            raise UsageError("%run: a file to run")
        saved = sys.argv
        sys.argv = argv
        try:
            found = runpy.run_path(argv[0], run_name="__main__")
        finally:
            sys.argv = saved
        namespace.update({k: v for k, v in found.items() if not k.startswith("__")})

    def pip(args):
        shell("%s -m pip %s" % (shlex.quote(sys.executable or "python3"), args))

    def matplotlib(args):
        inline_backend()

    line_magics = {
        "cd": cd,
        "env": env,
        "pwd": lambda args: os.getcwd(),
        "time": lambda args: timed(args, "<magic-time>"),
        "timeit": timeit_line,
        "run": run_script,
        "pip": pip,
        "matplotlib": matplotlib,
    }

    def line(name, args):
        magic = line_magics.get(name)
        if magic is None:
            raise UsageError("Line magic function `%%%s` not found." % name)
        return magic(args)

    def write_file(args, body, filename):
        words = shlex.split(args)
        append = bool(words) and words[0] in ("-a", "--append")
        if append:
            words = words[1:]
        if len(words) != 1:
            raise UsageError("%%writefile: one file name (and -a to append)")
        path = os.path.expanduser(words[0])
        exists = os.path.exists(path)
        print("%s %s" % ("Appending to" if append else "Overwriting" if exists else "Writing", words[0]))
        with open(path, "a" if append else "w") as f:
            f.write(body)

    def script(interpreter):
        def run(args, body, filename):
            if args.strip():
                raise UsageError("%%%%%s: no options are taken here" % os.path.basename(interpreter))
            shell("%s -c %s" % (interpreter, shlex.quote(body)))
        return run

    def shown_as(mime):
        return lambda args, body, filename: display({mime: body}, raw=True)

    def time_cell(args, body, filename):
        return timed(body, filename)

    def timeit_cell(args, body, filename):
        number, repeat, setup = timeit_options(args)
        time_it(body, setup, number, repeat)

    cell_magics = {
        "writefile": write_file,
        "bash": script("/bin/bash"),
        "sh": script("/bin/sh"),
        "time": time_cell,
        "timeit": timeit_cell,
        "html": shown_as("text/html"),
        "markdown": shown_as("text/markdown"),
        "latex": shown_as("text/latex"),
        "svg": shown_as("image/svg+xml"),
        "javascript": shown_as("application/javascript"),
        "js": shown_as("application/javascript"),
    }

    def cell(name, args, body, filename, first_line):
        """Cell magic `name` on `body`, the lines after the magic's line (`first_line`, from
        1): code in it is run with the cell's own line numbers."""
        magic = cell_magics.get(name)
        if magic is None:
            raise UsageError("Cell magic `%%%%%s` not found." % name)
        if name == "time":
            body = "\n" * first_line + body
        return magic(args, body, filename)

    def capture(command):
        """`x = !cmd`: the command's output lines; its errors still reach the cell."""
        sys.stdout.flush()
        sys.stderr.flush()
        done = subprocess.run(["/bin/sh", "-c", command], stdout=subprocess.PIPE)
        namespace["_exit_code"] = done.returncode
        return _KoderSList(done.stdout.decode("utf-8", "replace").splitlines())

    return line, cell, capture
