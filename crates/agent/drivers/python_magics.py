# IPython's magics that notebook code uses, for images without IPython (prepended to the
# Python driver, like the chart reader).
#
# E2B's kernels are IPython, and code written for notebooks starts with `%matplotlib inline`,
# writes files with `%%writefile`, times with `%time`/`%timeit`, hides an install's noise
# with `%%capture`. The driver rewrites a cell's magic lines into calls of these only when
# the cell is not Python as it is; a magic not here is IPython's own error (`UsageError`),
# not silently skipped.


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


def _koder_magics(namespace, host):
    """The line-magic, cell-magic and shell functions for cells run in `namespace`. `host` is
    what the driver owns: `evaluate(source, filename)` runs code as a cell does and returns
    its last value, `display(obj, raw=False)` shows an object (or a MIME bundle), `show(data)`
    sends a result the driver made, `divert(sink)` sends the run's results to the list `sink`
    instead (None: to the run) and returns the sink it replaces, `flush_figures()` shows the
    figures still open, `flush_std()` flushes Python's streams, `inline_backend()` makes
    matplotlib draw into results again, `figure_formats(names)` chooses the formats figures
    are shown in, `mime_keys` pairs MIME types with the keys of results, `cell_filename()`
    names the running cell's code."""
    import ast
    import codecs
    import fnmatch
    import importlib
    import importlib.util
    import io
    import json
    import math
    import os
    import re
    import runpy
    import shlex
    import shutil
    import string
    import subprocess
    import sys
    import threading
    import time
    import timeit
    import traceback
    import types
    import weakref

    class UsageError(Exception):
        """IPython's name for a magic used wrongly or not known; shown as IPython shows it,
        its message without a traceback (which would be the driver's)."""

        without_traceback = True

    UsageError.__qualname__ = "UsageError"

    class Reloader:
        """IPython's autoreload: before a cell runs, each module whose source file changed
        since it was loaded is loaded again, and the functions and classes the old module made
        take the new code in place, so that names imported from it (`from m import f`) and
        instances of its classes see the change. Mode 0 is off, 1 reloads only the modules
        `%aimport` named, 2 (and 3) all but those `%aimport -name` skips."""

        def __init__(self):
            self.mode = 0
            self.only, self.skip = set(), set()
            self.seen = {}  # module name -> its file's (mtime, size) when last loaded
            self.failed = {}  # module name -> the (mtime, size) whose load failed, not retried
            self.old = {}  # (module name, attribute) -> weak references to its earlier objects

        def source(self, module):
            path = getattr(module, "__file__", None)
            if not isinstance(path, str) or not path.endswith(".py"):
                return None
            try:
                found = os.stat(path)
                return found.st_mtime_ns, found.st_size
            except OSError:
                return None

        def note_imports(self):
            """After a cell: the modules it imported are known as they are now."""
            if self.mode == 0:
                return
            for name, module in list(sys.modules.items()):
                if name not in self.seen and module is not None:
                    stamp = self.source(module)
                    if stamp is not None:
                        self.seen[name] = stamp

        def check(self, everything=False):
            """Before a cell: reloads the modules whose files changed."""
            if self.mode == 0 and not everything:
                return
            for name, module in list(sys.modules.items()):
                if module is None or name in self.skip or name == "__main__":
                    continue
                if self.mode == 1 and not everything and name not in self.only:
                    continue
                stamp = self.source(module)
                if stamp is None:
                    continue
                known = self.seen.setdefault(name, stamp)
                if stamp == known or self.failed.get(name) == stamp:
                    continue
                try:
                    self.reload(module)
                    self.seen[name] = stamp
                    self.failed.pop(name, None)
                except Exception:
                    self.failed[name] = stamp
                    print("[autoreload of %s failed: %s]" % (
                        name, traceback.format_exc(limit=-1).strip()), file=sys.stderr)

        def reload(self, module):
            name = module.__name__
            for attr, obj in list(module.__dict__.items()):
                if getattr(obj, "__module__", None) == name:
                    try:
                        self.old.setdefault((name, attr), []).append(weakref.ref(obj))
                    except TypeError:
                        pass  # not weakly referable: nothing to update in place
            before = dict(module.__dict__)
            # The bytecode cache is checked against the source's mtime in whole seconds and its
            # size: a file rewritten within the second it was compiled, to the same size (`1`
            # made `2`), would load its old code again.
            try:
                os.unlink(importlib.util.cache_from_source(module.__file__))
            except (OSError, ValueError, NotImplementedError):
                pass
            try:
                importlib.reload(module)
            except BaseException:
                module.__dict__.update(before)
                raise
            for attr, new in list(module.__dict__.items()):
                refs = [r for r in self.old.get((name, attr), ()) if r() is not None]
                for ref in refs:
                    self.update(ref(), new)
                if refs:
                    self.old[(name, attr)] = refs
                else:
                    self.old.pop((name, attr), None)

        def update(self, old, new):
            """Makes `old` (a function or class of the module's last load) behave as `new`."""
            if old is new:
                return True
            if isinstance(old, types.FunctionType) and isinstance(new, types.FunctionType):
                for attr in ("__code__", "__defaults__", "__kwdefaults__", "__doc__", "__dict__",
                             "__annotations__"):
                    try:
                        setattr(old, attr, getattr(new, attr))
                    except (AttributeError, TypeError, ValueError):
                        pass  # a closure's free variables differ: the old code stays
                return True
            if isinstance(old, property) and isinstance(new, property):
                for part in ("fget", "fset", "fdel"):
                    self.update(getattr(old, part), getattr(new, part))
                return True
            if isinstance(old, (classmethod, staticmethod)) and type(old) is type(new):
                return self.update(old.__func__, new.__func__)
            if isinstance(old, type) and isinstance(new, type):
                self.update_class(old, new)
                return True
            return False

        def update_class(self, old, new):
            for attr in list(old.__dict__):
                if attr in ("__dict__", "__weakref__", "__module__", "__qualname__"):
                    continue
                if attr not in new.__dict__:
                    try:
                        delattr(old, attr)
                    except (AttributeError, TypeError):
                        pass
                    continue
                if not self.update(old.__dict__[attr], new.__dict__[attr]):
                    try:
                        setattr(old, attr, new.__dict__[attr])
                    except (AttributeError, TypeError):
                        pass
            for attr, value in new.__dict__.items():
                if attr not in old.__dict__ and attr not in ("__dict__", "__weakref__"):
                    try:
                        setattr(old, attr, value)
                    except (AttributeError, TypeError):
                        pass

    previous = []

    def writes_to(stream, fd):
        try:
            return stream.fileno() == fd
        except Exception:
            return False

    def pump(pipe, stream, kept, index):
        """Copies a child's output to `stream` as it comes, or keeps it in `kept[index]`."""
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        parts = []
        while True:
            chunk = pipe.read1(65536) if hasattr(pipe, "read1") else pipe.read(65536)
            text = decoder.decode(chunk, final=not chunk)
            if stream is None:
                parts.append(text)
            elif text:
                try:
                    stream.write(text)
                except Exception:
                    stream = None  # a closed stream: the rest is dropped, the child not blocked
            if not chunk:
                break
        pipe.close()
        kept[index] = "".join(parts)

    def run_process(argv, stdin=None, keep_stdout=False, keep_stderr=False):
        """Runs `argv`, its output where the cell's goes: the run's own descriptors when the
        cell's streams are them, else through sys.stdout/sys.stderr (a cell whose output is
        captured, as ipykernel does); `keep_*` returns that stream's text instead. Returns
        (status, stdout, stderr)."""
        host.flush_std()
        streams = ((sys.stdout, 1, keep_stdout), (sys.stderr, 2, keep_stderr))
        pipes = [subprocess.PIPE if keep or not writes_to(stream, fd) else None
                 for stream, fd, keep in streams]
        process = subprocess.Popen(
            argv, stdin=None if stdin is None else subprocess.PIPE, stdout=pipes[0],
            stderr=pipes[1])
        kept = ["", ""]
        outputs = zip(streams, (process.stdout, process.stderr))
        threads = [threading.Thread(target=pump, args=(pipe, None if keep else stream, kept, i),
                                    daemon=True)
                   for i, ((stream, _, keep), pipe) in enumerate(outputs) if pipe is not None]
        if stdin is not None:
            threads.append(threading.Thread(target=feed, args=(process.stdin, stdin), daemon=True))
        for thread in threads:
            thread.start()
        try:
            status = process.wait()
        except BaseException:  # an interrupted run takes its child with it
            process.kill()
            process.wait()
            for thread in threads:
                thread.join(1)
            raise
        for thread in threads:
            thread.join()
        return status, kept[0], kept[1]

    def feed(pipe, text):
        try:
            pipe.write(text.encode("utf-8", "surrogateescape"))
            pipe.close()
        except OSError:
            pass  # the program did not read all of it

    class Expander(string.Formatter):
        """IPython's expansion of a shell line or a magic's arguments: `{expr}` is the value of
        the expression in the cell's namespace, `$name` (or `$name.attr`) of the name outside
        single quotes, `$$` a `$`, `{{` a `{`. If any of them fails, the text stays as it was,
        so a shell's own `${VAR}`, awk's `{print $1}` or find's `{}` pass through."""

        dollar = re.compile(r"\$(\$?[A-Za-z_][\w.]*)")

        def parse(self, text):
            for literal, field, spec, conversion in super().parse(text):
                if field == "":
                    raise ValueError("{} names nothing")  # not a positional argument
                done = 0
                kept = ""
                for m in self.dollar.finditer(literal):
                    if literal[m.end():].count("'") % 2:
                        continue  # inside single quotes: the shell's
                    if m.group(1).startswith("$"):
                        kept += literal[done:m.start()] + m.group(1)
                    else:
                        yield kept + literal[done:m.start()], m.group(1), "", None
                        kept = ""
                    done = m.end()
                yield kept + literal[done:], field, spec, conversion

        def get_field(self, field_name, args, kwargs):
            return eval(field_name, namespace), field_name

    expander = Expander()

    def expand(text):
        try:
            return expander.vformat(text, (), {})
        except Exception:
            return text

    def shell(command):
        """`!command`: its output is the cell's."""
        namespace["_exit_code"] = run_process(["/bin/sh", "-c", command])[0]

    def capture(command):
        """`x = !cmd`: the command's output lines; its errors still reach the cell."""
        status, out, _ = run_process(["/bin/sh", "-c", command], keep_stdout=True)
        namespace["_exit_code"] = status
        return _KoderSList(out.splitlines())

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
            return host.evaluate(source, filename)
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

    def profile_options(args, magic):
        """%prun's options: `-s KEY` (again for ties), `-l LIMIT`, `-q`, `-r`, `-T FILE` for
        the report, `-D FILE` for pstats' dump; the rest is the statement."""
        words = shlex.split(args, posix=False)
        options = {"sort": [], "limits": [], "quiet": False, "ret": False, "text": None,
                   "dump": None}
        while words and words[0] in ("-s", "-l", "-q", "-r", "-T", "-D"):
            flag = words.pop(0)
            if flag in ("-q", "-r"):
                options["quiet" if flag == "-q" else "ret"] = True
                continue
            if not words:
                raise UsageError("%%%s: %s takes a value" % (magic, flag))
            value = words.pop(0)
            if flag == "-s":
                options["sort"].append(value)
            elif flag == "-l":
                try:
                    options["limits"].append(float(value) if "." in value else int(value))
                except ValueError:
                    options["limits"].append(value)  # pstats takes a regular expression too
            else:
                options["text" if flag == "-T" else "dump"] = value
        return options, " ".join(words)

    def profiled(options, source, filename):
        """Runs `source` under cProfile and prints pstats' report, as IPython's %prun."""
        import cProfile
        import pstats

        profile = cProfile.Profile()
        code = compile(source, filename, "exec")
        try:
            profile.runctx(code, namespace, namespace)
        finally:
            report = io.StringIO()
            stats = pstats.Stats(profile, stream=report)
            stats.strip_dirs().sort_stats(*(options["sort"] or ["time"]))
            stats.print_stats(*options["limits"])
            if not options["quiet"]:
                print(report.getvalue().rstrip("\n"))
            if options["text"]:
                with open(options["text"], "w") as f:
                    f.write(report.getvalue())
                print("\n*** Profile printout saved to text file %r." % options["text"])
            if options["dump"]:
                stats.dump_stats(options["dump"])
                print("\n*** Profile stats marshalled to file %r." % options["dump"])
        return stats if options["ret"] else None

    def prun_line(args):
        options, stmt = profile_options(args, "prun")
        if not stmt.strip():
            raise UsageError("%prun: a statement to profile")
        return profiled(options, stmt, "<magic-prun>")

    def prun_cell(args, body, filename):
        options, rest = profile_options(args, "prun")
        # IPython runs a statement left on the magic's line before the body.
        return profiled(options, rest + body, filename)

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
        host.inline_backend()

    config_assignment = re.compile(r"^InlineBackend\.(figure_formats?)\s*=\s*(.+)$")

    def config(args):
        """`%config InlineBackend.figure_format = 'svg'` (or `figure_formats = {...}`), the
        one configurable cells here have: the formats figures are shown in."""
        args = args.strip()
        if not args:
            print("Available objects for config:\n    InlineBackend")
            return
        m = config_assignment.match(args)
        if m is None:
            raise UsageError("%config: only InlineBackend.figure_format(s) can be set here")
        try:
            value = ast.literal_eval(m.group(2).strip())
        except (ValueError, SyntaxError):
            raise UsageError("%config: not a Python literal: " + m.group(2).strip()) from None
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, (list, tuple, set, frozenset)) or not all(
                isinstance(name, str) for name in names):
            raise UsageError("%config: figure formats are names such as 'png' or 'svg'")
        try:
            host.figure_formats(names)
        except ValueError as e:
            raise UsageError("%config: " + str(e)) from None

    class History:
        """IPython's input and output history: `In` (`_ih`) holds each cell's code at its
        execution count, `_i`/`_ii`/`_iii` the three before the running one and `_i<n>` cell
        n's; a cell's shown value goes to `Out` (`_oh`), `_<n>`, and `_` (`__`, `___` the
        two before) unless the cell assigned one of those itself. At most `kept` values are
        held, the oldest dropped first."""

        kept = 1000

        def __init__(self):
            self.inputs = [""]
            self.outputs = {}
            self.recent = [""] * 3  # _i, _ii, _iii
            self.unders = [None] * 3  # _, __, ___
            self.bind()

        def bind(self):
            namespace.update(In=self.inputs, _ih=self.inputs, Out=self.outputs,
                             _oh=self.outputs)

        def hidden(self, value):
            return value is self.inputs or value is self.outputs

        def before(self, n, code):
            if n <= 0:
                return
            self.inputs.extend([""] * (n + 1 - len(self.inputs)))
            previous = self.inputs[n - 1] if n > 1 else ""
            self.recent = [previous] + self.recent[:2]
            self.inputs[n] = code
            namespace.update(_i=self.recent[0], _ii=self.recent[1], _iii=self.recent[2])
            namespace["_i%d" % n] = code

        def after(self, n, value):
            if value is self.outputs:
                return
            names = ("_", "__", "___")
            mine = all(namespace.get(k, v) is v for k, v in zip(names, self.unders))
            self.unders = [value] + self.unders[:2]
            if mine:
                namespace.update(zip(names, self.unders))
            if n <= 0:
                return
            self.outputs[n] = value
            namespace["_%d" % n] = value
            while len(self.outputs) > self.kept:
                oldest = min(self.outputs)
                del self.outputs[oldest]
                if namespace.get("_%d" % oldest, self) is not self:
                    namespace.pop("_%d" % oldest, None)

        def reset(self):
            """After `%reset`: inputs stay (as in IPython), outputs go."""
            self.outputs.clear()
            self.unders = [None] * 3
            self.bind()

        def magic(self, args):
            """%history [-n] [-o] [-p] [-g PATTERN] [-l N] [-f FILE] [N | N-M ...]"""
            try:
                words = shlex.split(args)
            except ValueError as e:
                raise UsageError("%history: " + str(e)) from None
            numbered = output = prompts = False
            pattern = last = target = None
            ranges = []
            i = 0
            while i < len(words):
                w = words[i]
                i += 1
                if w in ("-n", "-o", "-p"):
                    numbered |= w == "-n"
                    output |= w == "-o"
                    prompts |= w == "-p"
                elif w in ("-g", "-l", "-f"):
                    value = words[i] if i < len(words) and not words[i].startswith("-") else None
                    i += value is not None
                    if w == "-g":
                        pattern = value or ""
                        numbered = True
                    elif w == "-l":
                        last = int(value) if value and value.isdigit() else 10
                    elif value is None:
                        raise UsageError("%history: -f needs a file name")
                    else:
                        target = value
                else:
                    m = re.fullmatch(r"(\d+)(?:[-:](\d+))?", w)
                    if not m:
                        raise UsageError("%%history: not a cell number or range: %s" % w)
                    first = int(m.group(1))
                    ranges.extend(range(first, int(m.group(2) or first) + 1))
            cells = [n for n in range(1, len(self.inputs)) if self.inputs[n]]
            if ranges:
                cells = [n for n in ranges if 0 < n < len(self.inputs)]
            if pattern is not None:
                # A glob matched anywhere in a cell, as IPython's -g takes it.
                cells = [n for n in cells
                         if fnmatch.fnmatchcase(self.inputs[n], "*" + pattern + "*")]
            if last is not None:
                cells = cells[-last:] if last else []
            lines = []
            for n in cells:
                code = self.inputs[n].rstrip("\n")
                if prompts:
                    code = "\n".join((">>> " if k == 0 else "... ") + line
                                      for k, line in enumerate(code.split("\n")))
                if numbered:
                    code = "%4d: %s" % (n, code.replace("\n", "\n      "))
                lines.append(code)
                if output and n in self.outputs:
                    lines.append(repr(self.outputs[n]))
            text = "\n".join(lines)
            if target is None:
                if text:
                    print(text)
                return
            with open(os.path.expanduser(target), "w") as f:
                f.write(text + "\n" if text else "")

    history = History()

    def user_names(types=()):
        """The names a cell defined (IPython's interactive namespace, without `In`/`Out`),
        optionally only those whose value's type is named in `types`."""
        return sorted(k for k, v in list(namespace.items())
                      if not k.startswith("_") and not history.hidden(v)
                      and (not types or type(v).__name__ in types))

    def who(args):
        names = user_names(args.split())
        print("\t".join(names) if names else "Interactive namespace is empty.")

    def whos(args):
        names = user_names(args.split())
        if not names:
            print("Interactive namespace is empty.")
            return
        rows = []
        for name in names:
            value = namespace[name]
            try:
                info = str(value).replace("\n", "\\n")
            except Exception as e:
                info = "<str failed: %s>" % type(e).__name__
            if len(info) >= 50:
                info = info[:25] + "<...>" + info[-25:]
            rows.append((name, type(value).__name__, info))
        widths = [max(len(row[i]) for row in rows + [("Variable", "Type", "")]) for i in (0, 1)]
        line = "%-*s   %-*s   %s"
        print(line % (widths[0], "Variable", widths[1], "Type", "Data/Info"))
        print("-" * (widths[0] + widths[1] + 18))
        for row in rows:
            print(line % (widths[0], row[0], widths[1], row[1], row[2]))

    def forced(args, magic):
        words = args.split()
        if "-f" not in words:
            # IPython asks for confirmation on stdin, which a run does not have.
            raise UsageError("%%%s: add -f (there is no one to confirm the deletion)" % magic)
        return [w for w in words if w != "-f"]

    def reset(args):
        if forced(args, "reset"):
            raise UsageError("%reset: only -f is taken here")
        for name in [k for k in namespace if not (k.startswith("__") and k.endswith("__"))]:
            del namespace[name]
        history.reset()

    def reset_selective(args):
        words = forced(args, "reset_selective")
        if len(words) != 1:
            raise UsageError("%reset_selective: one regular expression")
        try:
            pattern = re.compile(words[0])
        except re.error as e:
            raise UsageError("%reset_selective: " + str(e)) from None
        for name in [k for k in user_names() if pattern.search(k)]:
            del namespace[name]

    def load_ext(args):
        """`%load_ext autoreload`; any other extension needs IPython itself."""
        name = args.strip()
        if not name:
            raise UsageError("%load_ext: the extension to load")
        if name == "autoreload":
            line_magics.update(autoreload=autoreload_magic, aimport=aimport)
            return
        module = __import__(name, fromlist=["_"])  # missing: ModuleNotFoundError, as IPython
        if hasattr(module, "load_ipython_extension"):
            raise UsageError("%%load_ext: %s is an IPython extension; this interpreter is not "
                             "IPython" % name)
        raise UsageError("%%load_ext: %s is not an IPython extension" % name)

    reloader = Reloader()

    def autoreload_magic(args):
        words = args.split()
        modes = {"0": 0, "off": 0, "1": 1, "explicit": 1, "2": 2, "all": 2, "3": 2,
                 "complete": 2}
        modes_given = [w for w in words if not w.startswith("-")]
        if not modes_given:
            reloader.check(everything=True)
            return
        if len(modes_given) > 1 or modes_given[0] not in modes:
            raise UsageError("%autoreload: the mode is 0, 1, 2 or 3 (off, explicit, all, "
                             "complete)")
        reloader.mode = modes[modes_given[0]]

    def aimport(args):
        names = args.replace(",", " ").split()
        if not names:
            print("Modules to reload:\n%s\n\nModules to skip:\n%s" % (
                " ".join(sorted(reloader.only)), " ".join(sorted(reloader.skip))))
            return
        for name in names:
            if name.startswith("-"):
                reloader.skip.add(name[1:])
                reloader.only.discard(name[1:])
                continue
            reloader.only.add(name)
            reloader.skip.discard(name)
            __import__(name)
            top = name.split(".")[0]
            namespace[top] = sys.modules[top]

    def alias(command):
        """IPython's shell aliases (`%ls`, `%mkdir`, ...): the command with the line's words."""
        return lambda args: shell((command + " " + args).strip())

    line_magics = {
        "cd": cd,
        "env": env,
        "pwd": lambda args: os.getcwd(),
        "time": lambda args: timed(args, "<magic-time>"),
        "timeit": timeit_line,
        "prun": prun_line,
        "run": run_script,
        "pip": pip,
        "matplotlib": matplotlib,
        "config": config,
        "who": who,
        "whos": whos,
        "who_ls": lambda args: user_names(args.split()),
        "sx": lambda args: capture(args),
        "system": lambda args: capture(args),
        "reset": reset,
        "reset_selective": reset_selective,
        "load_ext": load_ext,
        "reload_ext": load_ext,
        "history": history.magic,
        "hist": history.magic,
        "lsmagic": lambda args: print(
            "Available line magics:\n%s\n\nAvailable cell magics:\n%s" % (
                "  ".join("%" + k for k in sorted(line_magics)),
                "  ".join("%%" + k for k in sorted(cell_magics)))),
        "ls": alias("ls -F"),
        "ll": alias("ls -F -o"),
        "cat": alias("cat"),
        "cp": alias("cp"),
        "mv": alias("mv"),
        "rm": alias("rm"),
        "mkdir": alias("mkdir"),
        "rmdir": alias("rmdir"),
    }

    # Whose arguments are code, Python literals or regular expressions, not expanded
    # (IPython's `no_var_expand`): `%config X.y = {'svg'}`, `%reset_selective -f x{2}`.
    verbatim = {"time", "timeit", "prun", "config", "reset_selective"}

    def line(name, args):
        magic = line_magics.get(name)
        if magic is None:
            raise UsageError("Line magic function `%%%s` not found." % name)
        return magic(args if name in verbatim else expand(args))

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

    def script_options(words, magic):
        """%%script's options (IPython 8's): `--out NAME`, `--err NAME` keep a stream in a
        variable instead of showing it, `--no-raise-error` makes a failure only a status."""
        options = {"out": None, "err": None, "raise": True}
        while words and words[0].startswith("--"):
            option = words.pop(0)
            if option in ("--out", "--err"):
                if not words or not words[0].isidentifier():
                    raise UsageError("%%%s: %s takes a variable name" % (magic, option))
                options[option[2:]] = words.pop(0)
            elif option == "--no-raise-error":
                options["raise"] = False
            else:
                raise UsageError("%%%s: unknown option %s" % (magic, option))
        return options, words

    def run_script_cell(magic, argv, options, body):
        """The cell's body as the standard input of `argv`, as IPython's %%script runs it."""
        program = shutil.which(argv[0])
        if program is None and argv[0] in ("python", "python3") and sys.executable:
            program = sys.executable
        if program is None:
            raise UsageError("Couldn't find program: %r" % argv[0])
        status, out, err = run_process([program] + argv[1:], stdin=body,
                                       keep_stdout=bool(options["out"]),
                                       keep_stderr=bool(options["err"]))
        for key, text in (("out", out), ("err", err)):
            if options[key]:
                namespace[options[key]] = text
        if status != 0 and options["raise"]:
            raise subprocess.CalledProcessError(status, body)

    def script_cell(args, body, filename):
        options, argv = script_options(shlex.split(args), "script")
        if not argv:
            raise UsageError("%%script: the program to run the cell with")
        run_script_cell("script", argv, options, body)

    def script(program):
        def run(args, body, filename):
            options, rest = script_options(shlex.split(args), program)
            if rest:
                raise UsageError("%%%s: unexpected %s" % (program, " ".join(rest)))
            run_script_cell(program, [program], options, body)
        return run

    def shown_as(mime):
        return lambda args, body, filename: host.display({mime: body}, raw=True)

    def time_cell(args, body, filename):
        return timed(body, filename)

    def timeit_cell(args, body, filename):
        number, repeat, setup = timeit_options(args)
        time_it(body, setup, number, repeat)

    def capture_cell(args, body, filename):
        """`%%capture [--no-stdout] [--no-stderr] [--no-display] [name]`: the cell's output
        (its commands' too) and results kept, not shown; in `name` as IPython's CapturedIO."""
        words = shlex.split(args)
        flags = {w for w in words if w.startswith("-")}
        names = [w for w in words if not w.startswith("-")]
        unknown = flags - {"--no-stdout", "--no-stderr", "--no-display"}
        if unknown:
            raise UsageError("%%capture: unknown option " + sorted(unknown)[0])
        if len(names) > 1 or (names and not names[0].isidentifier()):
            raise UsageError("%%capture: at most one variable name")
        out = None if "--no-stdout" in flags else io.StringIO()
        err = None if "--no-stderr" in flags else io.StringIO()
        sink = None if "--no-display" in flags else []
        host.flush_std()
        saved = sys.stdout, sys.stderr
        replaced = host.divert(sink) if sink is not None else None
        sys.stdout, sys.stderr = out or sys.stdout, err or sys.stderr
        try:
            value = host.evaluate(body, filename)
            if value is not None:
                host.display(value)
            if sink is not None:
                host.flush_figures()
        finally:
            sys.stdout, sys.stderr = saved
            if sink is not None:
                host.divert(replaced)
        captured = CapturedIO(out, err, [RichOutput(data) for data in sink or []])
        if names:
            namespace[names[0]] = captured

    class RichOutput:
        """One captured result: `data` is its MIME bundle; `display()` shows it again."""

        def __init__(self, shown):
            self._shown = shown
            self.metadata = {}
            self.data = {mime: shown[key] for mime, key in host.mime_keys if key in shown}
            # The driver made `extra` itself, from a bundle's other types.
            self.data.update(json.loads(shown.get("extra") or "{}"))

        def display(self):
            host.show(self._shown)

        def _repr_mimebundle_(self, include=None, exclude=None):
            return self.data

    class CapturedIO:
        """IPython's: `stdout` and `stderr` as text, `outputs` the results; `show()` (or a
        call) shows them all where the cell's output goes."""

        def __init__(self, out, err, outputs):
            self._out, self._err, self.outputs = out, err, outputs

        @property
        def stdout(self):
            return self._out.getvalue() if self._out is not None else ""

        @property
        def stderr(self):
            return self._err.getvalue() if self._err is not None else ""

        def show(self):
            sys.stdout.write(self.stdout)
            sys.stderr.write(self.stderr)
            for output in self.outputs:
                output.display()

        __call__ = show

        def __str__(self):
            return self.stdout

    cell_magics = {
        "writefile": write_file,
        "file": write_file,
        "capture": capture_cell,
        "script": script_cell,
        "time": time_cell,
        "timeit": timeit_cell,
        "prun": prun_cell,
        "html": shown_as("text/html"),
        "markdown": shown_as("text/markdown"),
        "latex": shown_as("text/latex"),
        "svg": shown_as("image/svg+xml"),
        "javascript": shown_as("application/javascript"),
        "js": shown_as("application/javascript"),
    }
    # IPython's script magics: the cell is the program's input.
    cell_magics.update((name, script(name)) for name in (
        "sh", "bash", "perl", "ruby", "python", "python2", "python3", "pypy"))

    def cell(name, args, body, filename, first_line):
        """Cell magic `name` on `body`, the lines after the magic's line (`first_line`, from
        1): code in it is run with the cell's own line numbers."""
        magic = cell_magics.get(name)
        if magic is None:
            raise UsageError("Cell magic `%%%%%s` not found." % name)
        if name in ("time", "capture", "prun"):
            body = "\n" * first_line + body
        return magic(args if name in verbatim else expand(args), body, filename)

    def is_automagic(name):
        """A line starting with `name` and not Python is that line magic, as with IPython's
        automagic (`pip install x`, `cd dir`), unless the cell has a variable so named."""
        return name in line_magics and name not in namespace

    class Shell:
        """The part of IPython's InteractiveShell that notebooks exported as scripts call
        (`get_ipython().run_line_magic('matplotlib', 'inline')`, `.system('ls')`,
        `.getoutput('ls')`, `.run_cell_magic('bash', '', body)`), and a few helpers."""

        user_ns = namespace

        def __repr__(self):
            return "<koder-sandbox's IPython shell for cells>"

        def run_line_magic(self, magic_name, line_text, _stack_depth=1):
            return line(magic_name, line_text)

        def run_cell_magic(self, magic_name, line_text, body):
            return cell(magic_name, line_text, body, host.cell_filename(), 0)

        def magic(self, arg_s):
            name, _, rest = arg_s.lstrip("%").partition(" ")
            return line(name, rest)

        def system(self, command):
            shell(expand(command))

        def getoutput(self, command, split=True):
            lines = capture(expand(command))
            return lines if split else lines.n

        def push(self, variables):
            if not isinstance(variables, dict):
                raise TypeError("push takes a dict of names and values here")
            namespace.update(variables)

        def ev(self, expr):
            return eval(expr, namespace)

        def ex(self, source):
            exec(source, namespace)

    return types.SimpleNamespace(
        line=line, cell=cell, ipython=Shell(), shell=lambda command: shell(expand(command)),
        capture=lambda command: capture(expand(command)), is_automagic=is_automagic,
        reloader=reloader, history=history)
