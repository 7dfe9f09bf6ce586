# koder-sandbox code-interpreter driver for Python, started by the agent as `python3 -u -c`.
#
# Requests arrive one JSON object per line on fd 3 ({"code", "n"}); events leave one JSON
# object per line on fd 4 ({"ev": "ready" | "display" | "done", ...}). fds 1 and 2 are the
# agent's pipes for user output, so nothing user code prints (nor any process it starts) can
# reach the control channel. Standard library only; matplotlib and pandas are used when present.
# Must run on every Python 3.8+ an image may carry.


def _koder_driver():
    import ast
    import asyncio
    import base64
    import builtins
    import importlib.abc
    import importlib.util
    import inspect
    import json
    import linecache
    import os
    import re
    import signal
    import sys
    import threading
    import tokenize
    import traceback
    import types

    # The agent's limits are the real ones; these keep a run from producing lines the agent
    # would have to throw away (one run's events must fit in one protocol frame).
    result_budget = 860 * 1024
    max_text = 256 * 1024
    max_error_value = 16 * 1024
    max_traceback = 64 * 1024
    max_results = 256

    # dup() gives non-inheritable descriptors: processes user code starts must not hold the
    # control channel open (the agent reads its end-of-file as the interpreter's death).
    ctl_in = os.fdopen(os.dup(3), "rb")
    ctl_out = os.dup(4)
    os.close(3)
    os.close(4)
    emit_lock = threading.Lock()

    def emit(event):
        data = (json.dumps(event, ensure_ascii=True) + "\n").encode("ascii")
        view = memoryview(data)
        with emit_lock:
            while view:
                view = view[os.write(ctl_out, view):]

    class Run:
        def __init__(self, n):
            self.n = n
            self.used = 0
            self.count = 0

    # `sink`: where results go instead of the run while a `%%capture` cell keeps them.
    state = types.SimpleNamespace(run=None, interruptible=False, sink=None,
                                  figure_formats=("png",))

    def clip(s, limit):
        if len(s) <= limit:
            return s
        return s[:limit] + "\n[... %d characters cut]" % (len(s) - limit)

    def send_output(data, main=False):
        if state.sink is not None:
            state.sink.append(data)
            return
        run = state.run
        if run is None or not data or run.count >= max_results:
            return
        size = sum(len(v) for v in data.values())
        if run.used + size > result_budget:
            data = {"text": "[output of %d bytes omitted: over this run's result budget]" % size}
            size = len(data["text"])
        run.used += size
        run.count += 1
        emit({"ev": "display", "n": run.n, "main": main, "data": data})

    def is_figure(obj):
        t = type(obj)
        return t.__module__.startswith("matplotlib.figure") and hasattr(obj, "savefig")

    # The formats `%config InlineBackend.figure_formats` names (matplotlib-inline's), as
    # (result key, savefig format, resolution factor).
    figure_format_names = {"png": ("png", "png", 1), "retina": ("png", "png", 2),
                           "png2x": ("png", "png", 2), "jpg": ("jpeg", "jpeg", 1),
                           "jpeg": ("jpeg", "jpeg", 1), "svg": ("svg", "svg", 1),
                           "pdf": ("pdf", "pdf", 1)}

    def choose_figure_formats(names):
        unknown = sorted(set(names) - set(figure_format_names))
        if unknown or not names:
            raise ValueError("figure formats are %s, not %s" % (
                ", ".join(sorted(figure_format_names)), ", ".join(unknown) or "none"))
        state.figure_formats = tuple(names)

    def figure_images(fig):
        import io

        shown = {}
        for name in state.figure_formats:
            key, fmt, scale = figure_format_names[name]
            buf = io.BytesIO()
            fig.savefig(buf, format=fmt, bbox_inches="tight", dpi=fig.dpi * scale)
            value = buf.getvalue()
            if key == "svg":
                shown[key] = value.decode("utf-8")
            else:
                shown[key] = base64.b64encode(value).decode("ascii")
        return shown

    def figure_shown(fig):
        """A figure's images and, unless it is too large to be worth its room in the run's
        results, the data of the chart it draws (E2B's `chart`; read after the drawing
        filled in its tick labels)."""
        shown = figure_images(fig)
        try:
            chart = json.dumps(_koder_chart(fig), allow_nan=False)
        except Exception:
            return shown
        if chart != "null" and len(chart) <= max_text:
            shown["chart"] = chart
        return shown

    mime_keys = (("text/plain", "text"), ("text/html", "html"), ("text/markdown", "markdown"),
                 ("image/svg+xml", "svg"), ("image/png", "png"), ("image/jpeg", "jpeg"),
                 ("text/latex", "latex"), ("application/json", "json"),
                 ("application/pdf", "pdf"), ("application/javascript", "javascript"))

    # A larger table has no `data` form: converting it would cost every such result time, and
    # its size would push the table's html and text over the run's result budget with it.
    max_table_cells = 100_000

    def table_columns(obj):
        """A pandas DataFrame's columns (name → values), as E2B's `data` format has them."""
        pandas = sys.modules.get("pandas")
        if pandas is None or not isinstance(obj, pandas.DataFrame):
            return None
        if getattr(obj, "size", max_table_cells + 1) > max_table_cells:
            return None
        try:
            columns = obj.to_dict(orient="list")
        except Exception:
            return None

        def plain(v):
            if isinstance(v, pandas.Timestamp):
                return v.isoformat()
            try:
                missing = pandas.isna(v) is True  # NaN, None, NaT, pd.NA; not a list's array
            except Exception:
                missing = False
            if missing or (isinstance(v, float) and v in (float("inf"), float("-inf"))):
                return None
            return v

        try:
            text = json.dumps({str(k): [plain(v) for v in vs] for k, vs in columns.items()},
                              default=str, allow_nan=False)
        except Exception:
            return None
        return text if len(text) <= max_text else None

    def formats(obj, main=False):
        """Every representation `obj` offers, as the agent's mime keys."""
        data = {}
        if not isinstance(obj, type):
            bundle = call_repr(obj, "_repr_mimebundle_")
            if isinstance(bundle, tuple):
                bundle = bundle[0]
            if isinstance(bundle, dict):
                put_bundle(data, bundle)
            for attr, key in (("_repr_html_", "html"), ("_repr_markdown_", "markdown"),
                              ("_repr_svg_", "svg"), ("_repr_png_", "png"),
                              ("_repr_jpeg_", "jpeg"), ("_repr_latex_", "latex"),
                              ("_repr_json_", "json"), ("_repr_pdf_", "pdf"),
                              ("_repr_javascript_", "javascript")):
                if key not in data:
                    put(data, key, call_repr(obj, attr))
            put(data, "data", table_columns(obj))
            drawn = data.keys() & {"png", "svg", "jpeg"}
            if not drawn and is_figure(obj) and not managed_by_pyplot(obj):
                try:
                    data.update(figure_shown(obj))
                except Exception:
                    pass
        if "text" not in data:
            try:
                data["text"] = clip(repr(obj), max_text)
            except Exception as e:
                data["text"] = "<repr failed: %s>" % type(e).__name__
        if main and "json" not in data:
            try:
                if not (isinstance(obj, int) and not isinstance(obj, bool) and abs(obj) > 2**53):
                    text = json.dumps(obj, allow_nan=False)
                    if len(text) <= result_budget:
                        data["json"] = text
            except Exception:
                pass
        return data

    def call_repr(obj, attr):
        try:
            method = getattr(obj, attr, None)
            return method() if callable(method) else None
        except Exception:
            return None

    def put(data, key, value):
        if value is None:
            return
        try:
            if key in ("png", "jpeg", "pdf"):
                if isinstance(value, (bytes, bytearray)):
                    value = base64.b64encode(bytes(value)).decode("ascii")
                if isinstance(value, str):
                    data[key] = value
            elif key in ("json", "data"):
                data[key] = value if isinstance(value, str) else json.dumps(value, allow_nan=False)
            elif isinstance(value, str):
                data[key] = clip(value, max_text) if key == "text" else value
        except Exception:
            pass

    known_mimes = {mime for mime, _ in mime_keys}

    def put_bundle(data, bundle):
        """The representations of a MIME bundle (`{"text/html": ...}`) that results carry: each
        known type as its key, the others (Plotly's, widgets') together as `extra`."""
        for mime, key in mime_keys:
            if mime in bundle:
                put(data, key, bundle[mime])
        extra = {k: v for k, v in bundle.items() if isinstance(k, str) and k not in known_mimes}
        if extra:
            try:
                text = json.dumps(extra, allow_nan=False)
            except Exception:
                return
            if len(text) <= max_text:
                data["extra"] = text

    key_of_mime = dict(mime_keys)

    def only(data, include, exclude):
        """The representations `include` names (all without it), less those `exclude` names."""
        if include is not None:
            wanted = {key_of_mime.get(m) for m in include}
            data = {k: v for k, v in data.items() if k in wanted}
        if exclude:
            unwanted = {key_of_mime.get(m) for m in exclude}
            data = {k: v for k, v in data.items() if k not in unwanted}
        return data

    class DisplayHandle:
        """IPython's handle on a shown output. Results are appended, never replaced: an update
        shows the new object after the old one."""

        def __init__(self, display_id=None):
            import uuid

            self.display_id = uuid.uuid4().hex if display_id in (None, True) else display_id

        def display(self, obj, **kwargs):
            display(obj, **kwargs)

        def update(self, obj, **kwargs):
            display(obj, **kwargs)

        def __repr__(self):
            return "<DisplayHandle display_id=%s>" % self.display_id

    def display(*objs, raw=False, include=None, exclude=None, display_id=None, **_options):
        """Shows objects as rich outputs of the current run (IPython's display); with `raw`,
        each object is a MIME bundle (`{"text/latex": ...}`) shown as it is. With a
        `display_id`, gives IPython's handle on it."""
        for obj in objs:
            if raw and isinstance(obj, dict):
                data = {}
                put_bundle(data, obj)
                send_output(only(data, include, exclude))
            elif is_figure(obj) and managed_by_pyplot(obj):
                flush_figures(only=obj)
            else:
                send_output(only(formats(obj), include, exclude))
        return DisplayHandle(display_id) if display_id else None

    def update_display(obj, *, display_id, **kwargs):
        display(obj, **kwargs)

    def display_only(mime):
        """IPython's display_html() and its kin: the objects' `mime` representation only (with
        `raw`, the objects are that representation)."""

        def show(*objs, raw=False, metadata=None):
            if raw:
                objs = [{mime: obj} for obj in objs]
            display(*objs, raw=raw, include=[mime])

        return show

    display_functions = {
        "display_" + name: display_only(mime)
        for name, mime in (("pretty", "text/plain"), ("html", "text/html"),
                           ("markdown", "text/markdown"), ("svg", "image/svg+xml"),
                           ("png", "image/png"), ("jpeg", "image/jpeg"),
                           ("latex", "text/latex"), ("json", "application/json"),
                           ("javascript", "application/javascript"), ("pdf", "application/pdf"))
    }

    if not hasattr(builtins, "display"):
        builtins.display = display

    # matplotlib: a backend of our own makes plt.show() a display of every open figure, and
    # figures still open at the end of a run are shown and closed (Jupyter's inline behaviour).
    # It is selected when matplotlib is first imported, not through MPLBACKEND, so that
    # Python processes user code starts keep matplotlib's usual default.
    backend_name = "koder_mpl_backend"
    backend_source = (
        "from matplotlib.backends.backend_agg import FigureCanvasAgg as FigureCanvas\n"
        "from matplotlib.backend_bases import FigureManagerBase as FigureManager\n"
        "def show(*args, **kwargs):\n"
        "    _koder_flush()\n"
    )

    def managed_by_pyplot(fig):
        plt = sys.modules.get("matplotlib.pyplot")
        try:
            return plt is not None and fig.number in plt.get_fignums() and plt.figure(fig.number) is fig
        except Exception:
            return False

    def flush_figures(only=None):
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        try:
            nums = plt.get_fignums()
        except Exception:
            return
        for num in nums:
            try:
                fig = plt.figure(num)
                if only is not None and fig is not only:
                    continue
                send_output(dict(figure_shown(fig), text=repr(fig)))
            except Exception as e:
                sys.stderr.write("figure %s could not be rendered: %s\n" % (num, e))
            finally:
                try:
                    plt.close(num)
                except Exception:
                    pass

    def find_matplotlibrc(origin):
        # Debian's matplotlib reads its defaults from /etc/matplotlibrc, which a sandbox image
        # built around the host's /usr may not carry; the copy under /usr does as well.
        if "MATPLOTLIBRC" in os.environ or os.path.exists("/etc/matplotlibrc"):
            return
        candidates = ["/usr/share/matplotlib/mpl-data/matplotlibrc"]
        if origin:
            candidates.insert(0, os.path.join(os.path.dirname(origin), "mpl-data", "matplotlibrc"))
        for path in candidates:
            if os.path.isfile(path):
                os.environ["MATPLOTLIBRC"] = path
                return

    def configure_matplotlib(spec, real_exec, module):
        find_matplotlibrc(spec.origin)
        real_exec(module)
        if "MPLBACKEND" not in os.environ:
            try:
                module.rcParams["backend"] = "module://" + backend_name
            except Exception:
                pass

    def keep_box_stats(spec, real_exec, module):
        real_exec(module)
        try:
            _koder_keep_box_stats(module.Axes)
        except Exception:
            pass

    def show_pil_images(spec, real_exec, module):
        """A PIL image shown, or saved to a file, appears among the run's results, as in E2B's
        kernels (a sandbox has no viewer for show() to start)."""
        real_exec(module)
        try:
            image = module.Image
            saved = image.save
        except AttributeError:
            return

        def show(self, title=None, **_options):
            display(self)

        def save(self, fp, format=None, **params):
            if isinstance(fp, (str, os.PathLike)) and state.run is not None:
                display(self)
            return saved(self, fp, format, **params)

        image.show, image.save = show, save

    def render_plotly(spec, real_exec, module):
        """Plotly figures shown (`fig.show()`) or left as a cell's value are results, as in
        E2B's kernels: the figure as Plotly's JSON (its MIME type, under `extra`) and as HTML
        that draws it with plotly.js from Plotly's CDN. Plotly would otherwise open a browser,
        which a sandbox does not have."""
        real_exec(module)
        try:
            base, real_show = module.MimetypeRenderer, module.show
        except AttributeError:
            return

        class KoderRenderer(base):
            def to_mimebundle(self, fig_dict):
                from plotly.io._html import to_html
                from plotly.io._json import to_json

                as_json = json.loads(to_json(fig_dict, validate=False, remove_uids=False))
                html = to_html(fig_dict, include_plotlyjs="cdn", full_html=False, validate=False)
                return {"application/vnd.plotly.v1+json": as_json, "text/html": html}

        def show(fig, renderer=None, validate=True, **kwargs):
            if (renderer or module.renderers.default) != "koder":
                return real_show(fig, renderer, validate, **kwargs)
            from plotly.io._utils import validate_coerce_fig_to_dict

            display(KoderRenderer().to_mimebundle(validate_coerce_fig_to_dict(fig, validate)),
                    raw=True)

        try:
            module.renderers["koder"] = KoderRenderer()
            module.renderers.default = "koder"
            module.show = show
        except Exception:
            pass

    # What the hook does around the import of each module it watches.
    watched = {"matplotlib": configure_matplotlib, "matplotlib.axes": keep_box_stats,
               "PIL.Image": show_pil_images, "plotly.io._renderers": render_plotly}

    class WatchedImports(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            if name == backend_name:
                return importlib.util.spec_from_loader(name, self)
            around = watched.get(name)
            if around is None:
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            real_exec = spec.loader.exec_module
            spec.loader.exec_module = lambda module: around(spec, real_exec, module)
            return spec

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            module.__dict__["_koder_flush"] = flush_figures
            exec(compile(backend_source, "<koder matplotlib backend>", "exec"), module.__dict__)

    sys.meta_path.insert(0, WatchedImports())

    # IPython's display API (`from IPython.display import display, HTML, Image`), which code
    # written for Jupyter and E2B's kernels uses. Without IPython in the image, a module of the
    # same names is made here (the finder comes last, so an installed IPython wins; its own
    # display() prints, as it does outside a kernel).
    ipython_display_source = r'''
import html as _html
import os as _os


class DisplayObject:
    """Data given, or read from `filename` (or from `data` naming an existing file)."""

    _binary = False

    def __init__(self, data=None, url=None, filename=None, metadata=None):
        if (filename is None and isinstance(data, str) and "\n" not in data
                and len(data) < 4096 and _os.path.isfile(data)):
            filename, data = data, None
        if filename is not None:
            with open(filename, "rb" if self._binary else "r") as f:
                data = f.read()
        self.data, self.url, self.filename, self.metadata = data, url, filename, metadata


def _shown_as(name, method):
    """A display object whose data is its `method` representation as it is."""
    return type(name, (DisplayObject,), {method: lambda self: self.data})


HTML = _shown_as("HTML", "_repr_html_")
Markdown = _shown_as("Markdown", "_repr_markdown_")
Latex = _shown_as("Latex", "_repr_latex_")
SVG = _shown_as("SVG", "_repr_svg_")
JSON = _shown_as("JSON", "_repr_json_")
Javascript = _shown_as("Javascript", "_repr_javascript_")


class Math(DisplayObject):
    def _repr_latex_(self):
        return "$\\displaystyle %s$" % str(self.data).strip("$")


class Pretty(DisplayObject):
    def __repr__(self):
        return str(self.data)


class Image(DisplayObject):
    """A PNG or JPEG image (by its bytes, a file, or a URL shown as an <img>)."""

    _binary = True

    def __init__(self, data=None, url=None, filename=None, format=None, embed=None, width=None,
                 height=None, retina=False, unconfined=False, metadata=None, alt=None):
        if isinstance(data, str) and data.startswith(("http://", "https://")):
            url, data = data, None
        super().__init__(data, url, filename, metadata)
        fmt = (format or "").lower().replace("jpg", "jpeg")
        if not fmt and isinstance(self.data, bytes):
            fmt = {b"\x89P": "png", b"\xff\xd8": "jpeg"}.get(self.data[:2], "")
        if not fmt and self.filename:
            fmt = _os.path.splitext(self.filename)[1].lstrip(".").lower().replace("jpg", "jpeg")
        self.format, self.width, self.height = fmt, width, height

    def _repr_png_(self):
        return self.data if self.format == "png" and self.data else None

    def _repr_jpeg_(self):
        return self.data if self.format == "jpeg" and self.data else None

    def _repr_html_(self):
        if self.data is None and self.url:
            return '<img src="%s"/>' % _html.escape(self.url)
        return None

    def __repr__(self):
        return "<IPython.core.display.Image object>"


def clear_output(wait=False):
    """Outputs already sent stay: a run's results are appended to, not redrawn."""


class IFrame:
    """A page embedded by its address."""

    def __init__(self, src, width, height, extras=None, **kwargs):
        self.src, self.width, self.height = src, width, height
        self.extras, self.params = list(extras or []), kwargs

    def _repr_html_(self):
        from urllib.parse import urlencode

        query = "?" + urlencode(self.params) if self.params else ""
        return '<iframe width="%s" height="%s" src="%s" frameborder="0" allowfullscreen %s></iframe>' % (
            _html.escape(str(self.width)), _html.escape(str(self.height)),
            _html.escape(self.src + query), " ".join(self.extras))


class FileLink:
    """A link to a file of the sandbox; its text is the file's absolute path."""

    def __init__(self, path, url_prefix="", result_html_prefix="", result_html_suffix="<br>"):
        if _os.path.isdir(path):
            raise ValueError("Cannot display a directory using FileLink. Use FileLinks to "
                             "display '%s'." % path)
        self.path, self.url_prefix = _os.fsdecode(path), url_prefix
        self.prefix, self.suffix = result_html_prefix, result_html_suffix

    def _repr_html_(self):
        if not _os.path.exists(self.path):
            return ("Path (<tt>%s</tt>) doesn't exist. It may still be in the process of being "
                    "generated, or you may have the incorrect path." % _html.escape(self.path))
        return "%s<a href='%s' target='_blank'>%s</a>%s" % (
            self.prefix, _html.escape(self.url_prefix + self.path), _html.escape(self.path),
            self.suffix)

    def __repr__(self):
        return _os.path.abspath(self.path)


class FileLinks:
    """Links to the files below a directory, one line each."""

    def __init__(self, path, url_prefix="", included_suffixes=None, recursive=True):
        if not _os.path.isdir(path):
            raise ValueError("Cannot display a file using FileLinks. Use FileLink to display "
                             "'%s'." % path)
        self.path, self.url_prefix = _os.fsdecode(path), url_prefix
        self.suffixes, self.recursive = included_suffixes, recursive

    def _files(self):
        for root, dirs, files in _os.walk(self.path):
            dirs.sort()
            if not self.recursive:
                dirs.clear()
            yield root, sorted(f for f in files if not self.suffixes
                               or _os.path.splitext(f)[1] in self.suffixes)

    def _repr_html_(self):
        lines = []
        for root, files in self._files():
            lines.append(_html.escape(root) + "/<br>")
            lines.extend(FileLink(_os.path.join(root, f), self.url_prefix, "&nbsp;&nbsp;")._repr_html_()
                         for f in files)
        return "\n".join(lines)

    def __repr__(self):
        lines = []
        for root, files in self._files():
            lines.append(root + "/")
            lines.extend("  " + f for f in files)
        return "\n".join(lines)


class Code(DisplayObject):
    """Source code: highlighted by Pygments when the image has it, else preformatted."""

    def __init__(self, data=None, url=None, filename=None, language=None):
        self.language = language
        super().__init__(data, url, filename)

    def _repr_html_(self):
        try:
            from pygments import highlight
            from pygments.formatters import HtmlFormatter
            from pygments.lexers import get_lexer_by_name, guess_lexer

            lexer = get_lexer_by_name(self.language) if self.language else guess_lexer(self.data)
            formatter = HtmlFormatter()
            return "<style>%s</style>%s" % (formatter.get_style_defs(".output_html"),
                                            highlight(self.data, lexer, formatter))
        except Exception:
            return "<pre>%s</pre>" % _html.escape(str(self.data))

    def __repr__(self):
        return str(self.data)


def _wav(data, rate, normalize):
    """Samples (a list, or a numpy array of one row per channel) as a 16-bit WAV file."""
    import io
    import struct
    import wave

    try:
        import numpy

        samples = numpy.asarray(data, dtype=float)
        channels = 1 if samples.ndim == 1 else samples.shape[0]
        samples = samples.T.ravel() if samples.ndim == 2 else samples
        peak = float(numpy.max(numpy.abs(samples))) if samples.size else 0.0
        values = samples
    except ImportError:
        values = [float(v) for v in data]
        channels = 1
        peak = max((abs(v) for v in values), default=0.0)
    if normalize:
        scale = 32767 / peak if peak else 0
    elif peak > 1:
        raise ValueError("Audio data must be between -1 and 1 when normalize=False.")
    else:
        scale = 32767
    frames = struct.pack("<%dh" % len(values), *(int(v * scale) for v in values))
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(int(rate))
        w.writeframes(frames)
    return out.getvalue()


class Audio(DisplayObject):
    """Sound in an <audio> element: samples (with `rate`) made into a WAV, a file's bytes
    embedded, or an address linked."""

    _binary = True

    def __init__(self, data=None, filename=None, url=None, embed=None, rate=None,
                 autoplay=False, normalize=True, *, element_id=None):
        if isinstance(data, str) and data.startswith(("http://", "https://")):
            url, data = data, None
        made = False
        if data is not None and not isinstance(data, (bytes, bytearray, str)):
            if rate is None:
                raise ValueError("rate must be specified when data is a numpy array or list "
                                 "of audio samples.")
            data, made = _wav(data, rate, normalize), True
        super().__init__(data, url, filename)
        self.embed = self.data is not None if embed is None else embed
        self.autoplay, self.element_id = autoplay, element_id
        kinds = {".mp3": "audio/mpeg", ".ogg": "audio/ogg", ".oga": "audio/ogg",
                 ".flac": "audio/flac", ".m4a": "audio/mp4"}
        name = self.filename or self.url or ""
        self.mimetype = "audio/wav" if made else kinds.get(_os.path.splitext(name)[1].lower(),
                                                           "audio/wav")

    def _repr_html_(self):
        import base64

        if self.embed and self.data is not None:
            src = "data:%s;base64,%s" % (self.mimetype, base64.b64encode(self.data).decode("ascii"))
        else:
            src = self.url or self.filename or ""
        return ('<audio %scontrols="controls"%s>\n<source src="%s" type="%s" />\n'
                "Your browser does not support the audio element.\n</audio>") % (
            'id="%s" ' % _html.escape(self.element_id) if self.element_id else "",
            ' autoplay="autoplay"' if self.autoplay else "", _html.escape(src), self.mimetype)


class Video(DisplayObject):
    """A video in a <video> element: embedded (`embed=True`) or by its address or path."""

    _binary = True

    def __init__(self, data=None, url=None, filename=None, embed=False, mimetype=None,
                 width=None, height=None, html_attributes="controls"):
        if isinstance(data, str) and data.startswith(("http://", "https://")):
            url, data = data, None
        elif isinstance(data, str) and not embed and _os.path.isfile(data):
            url, data = data, None  # linked by its path, as IPython does without embed
        elif isinstance(data, (bytes, bytearray)) and not embed:
            raise ValueError("To embed videos, you must pass embed=True (this may make your "
                             "notebook files huge)")
        if filename is not None and not embed:
            url, filename = filename, None
        super().__init__(data, url, filename)
        name = self.filename or self.url or ""
        ext = _os.path.splitext(name)[1].lower().lstrip(".") or "mp4"
        self.mimetype = mimetype or {"mov": "video/quicktime", "ogv": "video/ogg"}.get(ext, "video/" + ext)
        self.embed, self.width, self.height = embed, width, height
        self.html_attributes = html_attributes

    def _repr_html_(self):
        import base64

        size = "".join(' %s="%s"' % (k, v) for k, v in (("width", self.width),
                                                         ("height", self.height)) if v)
        if self.embed and self.data is not None:
            data = self.data if isinstance(self.data, bytes) else base64.b64decode(self.data)
            return ('<video %s%s>\n <source src="data:%s;base64,%s" type="%s">\n '
                    "Your browser does not support the video tag.\n </video>") % (
                self.html_attributes, size, self.mimetype,
                base64.b64encode(data).decode("ascii"), self.mimetype)
        return ('<video src="%s" %s%s>\n Your browser does not support the <code>video</code> '
                "element.\n </video>") % (_html.escape(self.url or ""), self.html_attributes, size)
'''

    class IPythonFallback(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            if name in ("IPython", "IPython.display"):
                return importlib.util.spec_from_loader(name, self, is_package=name == "IPython")
            return None

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            if module.__name__ == "IPython":
                module.__dict__["get_ipython"] = get_ipython
                return
            exec(compile(ipython_display_source, "<koder IPython.display>", "exec"),
                 module.__dict__)
            module.__dict__.update(display_functions, display=display, DisplayHandle=DisplayHandle,
                                   update_display=update_display)

    sys.meta_path.append(IPythonFallback())

    # User code gets a fresh __main__ (pickle and multiprocessing look classes up there).
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    namespace = main.__dict__
    sys.argv = [""]
    loop = asyncio.new_event_loop()
    compile_flags = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)

    def execute(code_obj):
        result = eval(code_obj, namespace)
        if code_obj.co_flags & inspect.CO_COROUTINE:
            result = loop.run_until_complete(result)
        return result

    # IPython's syntax, which E2B's Jupyter kernels take: a line `!cmd` runs `cmd` in a shell
    # that prints as the cell does (`x = !cmd` takes its output lines instead), `%name args`
    # is a line magic (`x = %name` takes its value), and a cell starting with `%%name` a cell
    # magic (python_magics.py). Only a cell that is not Python as it is gets rewritten (such
    # a line never is); a line that starts with a line magic's name and is not Python is
    # that magic (IPython's automagic: `pip install x`). Lines inside a string are left as
    # they are. Shell lines and magics' arguments take IPython's `{expr}` and `$name`
    # (python_magics.py).
    escaped_line = re.compile(
        r"^([ \t]*)((?:[A-Za-z_][\w.]*[ \t]*,[ \t]*)*[A-Za-z_][\w.]*[ \t]*=[ \t]*)?(!|%(?=\w))(.*)$")
    magic_call = re.compile(r"^(\w+)[ \t]*(.*)$")
    cell_magic_line = re.compile(r"^%%(\w+)[ \t]*(.*)$")
    automagic_line = re.compile(r"^([ \t]*)([A-Za-z_]\w*)(?:[ \t]+(.*))?$")

    def inline_backend():
        """`%matplotlib inline`: figures are results again, whatever backend was chosen."""
        if "matplotlib" not in sys.modules:
            return  # the import hook chooses ours
        pyplot = sys.modules.get("matplotlib.pyplot")
        try:
            if pyplot is not None:
                pyplot.switch_backend("module://" + backend_name)
            else:
                sys.modules["matplotlib"].rcParams["backend"] = "module://" + backend_name
        except Exception:
            pass

    def flush_std():
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except Exception:
                pass

    def divert(sink):
        replaced, state.sink = state.sink, sink
        return replaced

    def cell_filename():
        return "<cell %d>" % (state.run.n if state.run else 0)

    magics = _koder_magics(
        namespace, types.SimpleNamespace(
            evaluate=lambda source, filename: evaluate(source, filename), display=display,
            show=send_output, divert=divert, flush_figures=flush_figures, flush_std=flush_std,
            inline_backend=inline_backend, figure_formats=choose_figure_formats,
            mime_keys=mime_keys, cell_filename=cell_filename))
    builtins._koder_shell = magics.shell
    builtins._koder_magic = magics.line
    builtins._koder_sh_capture = magics.capture
    builtins._koder_cell_magic = lambda name, args, body, first: magics.cell(
        name, args, body, cell_filename(), first)

    def get_ipython():
        """The shell for cells (notebooks exported as scripts call it); None for libraries,
        which would take it for IPython and reach for what only IPython has (its config, its
        events, its kernel), as they get None outside IPython."""
        caller = sys._getframe(1).f_code.co_filename
        return magics.ipython if caller.startswith("<cell ") else None

    # As in a kernel, cells call it without importing it.
    if not hasattr(builtins, "get_ipython"):
        builtins.get_ipython = get_ipython

    def escaped(line):
        """`line` with its shell escape or line magic as a call, or as it is."""
        body = line.rstrip("\r\n")
        m = escaped_line.match(body)
        if m is None:
            return automagic(line, body)
        indent, target, kind, rest = m.groups()
        if kind == "!" and rest.startswith("!") and not target:
            call = "_koder_sh_capture(%r)" % rest[1:]  # `!!cmd`: the output lines as a value
        elif kind == "!":
            call = "_koder_sh_capture(%r)" % rest if target else "_koder_shell(%r)" % rest
        else:
            name, args = magic_call.match(rest).groups()
            call = "_koder_magic(%r, %r)" % (name, args)
        return indent + (target or "") + call + line[len(body):]

    def automagic(line, body):
        m = automagic_line.match(body)
        if m is None or not magics.is_automagic(m.group(2)) or is_python(body.strip()):
            return line
        indent, name, args = m.groups()
        return indent + "_koder_magic(%r, %r)" % (name, args or "") + line[len(body):]

    def is_python(source):
        try:
            compile(source, "<line>", "exec", ast.PyCF_ONLY_AST | compile_flags, dont_inherit=True)
            return True
        except (SyntaxError, ValueError):
            return False

    def in_strings(lines):
        """The indexes of `lines` that begin inside a multi-line string: text, not code."""
        inside = set()
        try:
            for token in tokenize.generate_tokens(iter(lines).__next__):
                if token.type in (tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", None)):
                    inside.update(range(token.start[0], token.end[0]))
        except (tokenize.TokenError, SyntaxError, IndentationError):
            pass  # what came before the error is known; a cell with it fails to parse anyway
        return inside

    def with_ipython_syntax(code):
        lines = code.splitlines(True)
        first = next((i for i, l in enumerate(lines) if l.strip()), None)
        m = cell_magic_line.match(lines[first].strip()) if first is not None else None
        if m is not None:
            body = "".join(lines[first + 1:])
            return "\n" * first + "_koder_cell_magic(%r, %r, %r, %d)\n" % (
                m.group(1), m.group(2), body, first + 1)
        inside = in_strings(lines)
        return "".join(line if i in inside else escaped(line) for i, line in enumerate(lines))

    def without_leading_indent(code):
        # IPython's `leading_indent`: a cell whose first line is indented (code pasted from
        # inside a block, or a triple-quoted string in the caller's source) loses that indent
        # on every line that has it.
        lines = code.splitlines(True)
        first = next((l for l in lines if l.strip()), "")
        indent = first[: len(first) - len(first.lstrip(" \t"))]
        if not indent:
            return code
        return "".join(l[len(indent):] if l.startswith(indent) else l for l in lines)

    def parse(code, filename):
        flags = ast.PyCF_ONLY_AST | compile_flags
        try:
            return compile(code, filename, "exec", flags, dont_inherit=True)
        except SyntaxError as e:
            rewritten = with_ipython_syntax(code)
            if rewritten == code:
                raise
            try:
                return compile(rewritten, filename, "exec", flags, dont_inherit=True)
            except SyntaxError:
                raise e from None

    def evaluate(code, filename):
        """Runs `code` as a cell and returns its last expression's value (None without one)."""
        tree = parse(code, filename)
        last = None
        # A trailing semicolon hides the value, as in IPython (`plt.plot(x);`).
        quiet = code.rstrip().endswith(";")
        if tree.body and isinstance(tree.body[-1], ast.Expr) and not quiet:
            last = ast.Expression(tree.body.pop().value)
        if tree.body:
            execute(compile(tree, filename, "exec", compile_flags, dont_inherit=True))
        if last is None:
            return None
        return execute(compile(last, filename, "eval", compile_flags, dont_inherit=True))

    def run_cell(code, n):
        filename = "<cell %d>" % n
        code = without_leading_indent(code)
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        magics.reloader.check()
        magics.history.before(n, code)
        try:
            value = evaluate(code, filename)
        finally:
            magics.reloader.note_imports()
        if value is not None:
            magics.history.after(n, value)
            send_output(formats(value, main=True), main=True)

    def describe(exc):
        tb = exc.__traceback__
        # The driver's own frames (run_cell, execute) are noise to the user.
        while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell "):
            tb = tb.tb_next
        if isinstance(exc, SyntaxError) or getattr(type(exc), "without_traceback", False):
            lines = traceback.format_exception_only(type(exc), exc)
        else:
            lines = traceback.format_exception(type(exc), exc, tb)
        try:
            value = str(exc)
        except Exception:
            value = "<unprintable %s>" % type(exc).__name__
        return {
            "name": type(exc).__name__,
            "value": clip(value, max_error_value),
            "traceback": clip("".join(lines), max_traceback),
        }

    def serve(request):
        n = int(request.get("n", 0))
        code = request.get("code", "")
        state.run = Run(n)
        error = None
        # Variables of this run only: set for it, put back as they were once it ends.
        env = request.get("env") or {}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            try:
                state.interruptible = True
                run_cell(code, n)
            except BaseException as e:  # SystemExit and KeyboardInterrupt end the run, not us
                error = describe(e)
            finally:
                state.interruptible = False
            flush_std()
            flush_figures()
            flush_std()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            state.run = None
            emit({"ev": "done", "n": n, "error": error})

    def on_sigint(signum, frame):
        # The agent interrupts a run it was asked to cancel; the same signal arriving between
        # runs, or while the driver writes an event, must not break the control channel.
        if state.interruptible:
            raise KeyboardInterrupt

    state.interruptible = False
    signal.signal(signal.SIGINT, on_sigint)
    emit({"ev": "ready", "pid": os.getpid(), "version": sys.version.split()[0]})
    while True:
        try:
            line = ctl_in.readline()
            if not line:
                os._exit(0)  # the agent is gone
            try:
                request = json.loads(line)
            except ValueError:
                continue
            if isinstance(request, dict):
                serve(request)
        except KeyboardInterrupt:
            state.interruptible = False


_koder_driver()
