// koder-sandbox code-interpreter driver for Java, run by the agent as
// `java --source 11 /proc/self/fd/5` (the JDK's source launcher compiles it in memory; 11 is
// the oldest JDK it must run on).
//
// A context is one JShell held in this JVM (its "local" execution engine): classes, methods and
// variables one run declares are there for the next, as in E2B's Java kernel, and user output
// goes straight to fds 1 and 2, the agent's pipes. Java has no JSON reader, so requests arrive
// NUL-separated on fd 3 as for bash: the run's number, its code, then `NAME=value` fields up to
// an empty one. Events leave one JSON object per line on fd 4. As E2B's kernel, the
// environment is also in the system properties (`System.getProperty("FOO")`), a run's own
// variables only for that run. Standard library and jdk.jshell only; Java 11+.

import java.io.BufferedInputStream;
import java.io.ByteArrayOutputStream;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.lang.reflect.Proxy;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import jdk.jshell.Diag;
import jdk.jshell.EvalException;
import jdk.jshell.ExpressionSnippet;
import jdk.jshell.JShell;
import jdk.jshell.JShellException;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis;
import jdk.jshell.UnresolvedReferenceException;
import jdk.jshell.VarSnippet;

public class KoderDriver {
    // The agent's limits are the real ones; these keep a run's events within one frame.
    static final int MAX_TEXT = 256 * 1024;
    static final int MAX_ERROR_VALUE = 16 * 1024;
    static final int MAX_TRACEBACK = 64 * 1024;

    static OutputStream events;
    /// The run under way (counted from 1), or 0 between runs.
    static volatile long running;
    /// The run SIGINT stopped: it ends with an error saying so.
    static volatile long stopped;

    public static void main(String[] args) throws IOException {
        InputStream requests = new BufferedInputStream(new FileInputStream("/proc/self/fd/3"));
        events = new FileOutputStream("/proc/self/fd/4");
        Properties props = System.getProperties();
        for (Map.Entry<String, String> e : System.getenv().entrySet()) {
            props.putIfAbsent(e.getKey(), e.getValue());
        }
        JShell shell = JShell.builder().executionEngine("local").build();
        // The first evaluation loads the compiler: paid here, not by the first run.
        for (SnippetEvent e : shell.eval("int koderWarmUp = 0;")) {
            shell.drop(e.snippet());
        }
        onInterrupt(() -> {
            long run = running;
            if (run == 0) {
                return;
            }
            stopped = run;
            // A stop reaches only a snippet that is executing; one still being compiled would
            // start afterwards, so the stop is repeated until that run has ended (and only that
            // run: each signal is handled on a thread of its own, which may outlive it).
            while (running == run) {
                shell.stop();
                try {
                    Thread.sleep(20);
                } catch (InterruptedException e) {
                    return;
                }
            }
        });
        emit("{\"ev\":\"ready\",\"pid\":" + ProcessHandle.current().pid() + ",\"version\":"
                + quote(Runtime.version().toString()) + "}");
        for (long seq = 1;; seq++) {
            String n = field(requests);
            String code = field(requests);
            if (n == null || code == null) {
                return;
            }
            List<String[]> saved = new ArrayList<>();
            for (String kv = field(requests); kv != null && !kv.isEmpty(); kv = field(requests)) {
                int eq = kv.indexOf('=');
                String key = eq < 0 ? kv : kv.substring(0, eq);
                saved.add(new String[] {key, props.getProperty(key)});
                props.setProperty(key, eq < 0 ? "" : kv.substring(eq + 1));
            }
            running = seq;
            String error;
            try {
                error = run(shell, n, code, seq);
            } finally {
                running = 0;
            }
            if (stopped == seq && error.equals("null")) {
                error = error("InterruptedException", "the run was stopped", "");
            }
            System.out.flush();
            System.err.flush();
            for (String[] kv : saved) {
                if (kv[1] == null) {
                    props.remove(kv[0]);
                } else {
                    props.setProperty(kv[0], kv[1]);
                }
            }
            emit("{\"ev\":\"done\",\"n\":" + n + ",\"error\":" + error + "}");
        }
    }

    /// SIGINT (the agent cancelling a run) stops the running snippet, not the JVM. Through
    /// reflection: named in source, sun.misc.Signal makes the source launcher print warnings.
    static void onInterrupt(Runnable stop) {
        try {
            Class<?> signal = Class.forName("sun.misc.Signal");
            Class<?> handler = Class.forName("sun.misc.SignalHandler");
            Object h = Proxy.newProxyInstance(handler.getClassLoader(), new Class<?>[] {handler},
                    (proxy, method, args) -> {
                        switch (method.getName()) {
                            case "handle": stop.run(); return null;
                            case "hashCode": return System.identityHashCode(proxy);
                            case "equals": return proxy == args[0];
                            default: return "koder-interrupt";
                        }
                    });
            signal.getMethod("handle", signal, handler)
                    .invoke(null, signal.getConstructor(String.class).newInstance("INT"), h);
        } catch (ReflectiveOperationException e) {
            // Without the handler SIGINT ends the JVM; the agent then starts a new one.
            System.err.println("koder driver: no SIGINT handler: " + e);
        }
    }

    /// Runs the cell snippet by snippet, as JShell splits it; the first that fails ends it.
    /// Returns the run's error as JSON, or null; the last snippet's value is the run's result.
    static String run(JShell shell, String n, String code, long seq) throws IOException {
        SourceCodeAnalysis analysis = shell.sourceCodeAnalysis();
        String rest = code;
        String value = null;
        while (!rest.isBlank() && stopped != seq) {
            SourceCodeAnalysis.CompletionInfo info = analysis.analyzeCompletion(rest);
            String source;
            if (info.completeness().isComplete()) {
                source = info.source();
                rest = info.remaining();
            } else {
                // Incomplete or not Java: evaluated as it is, for JShell's own diagnostics.
                source = rest;
                rest = "";
            }
            value = null;
            for (SnippetEvent e : shell.eval(source)) {
                if (e.causeSnippet() != null) {
                    continue;
                }
                if (e.status() == Snippet.Status.REJECTED) {
                    return compileError(shell, e.snippet());
                }
                if (e.exception() != null) {
                    return thrown(e.exception());
                }
                value = valueOf(e);
            }
        }
        if (value != null) {
            emit("{\"ev\":\"display\",\"n\":" + n + ",\"main\":true,\"data\":{\"text\":"
                    + quote(clip(value, MAX_TEXT)) + "}}");
        }
        return "null";
    }

    /// The text of an expression's value: a string as it is (JShell shows it as a literal),
    /// anything else as JShell shows it; nothing for statements, declarations and null.
    static String valueOf(SnippetEvent e) {
        Snippet s = e.snippet();
        String type;
        if (s instanceof VarSnippet && s.subKind() == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND) {
            type = ((VarSnippet) s).typeName();
        } else if (s instanceof ExpressionSnippet) {
            type = ((ExpressionSnippet) s).typeName();
        } else {
            return null;
        }
        String v = e.value();
        if (v == null || v.equals("null")) {
            return null;
        }
        boolean string = type.equals("String") || type.equals("java.lang.String");
        if (string && v.length() >= 2 && v.startsWith("\"") && v.endsWith("\"")) {
            return unescape(v.substring(1, v.length() - 1));
        }
        return v;
    }

    static String compileError(JShell shell, Snippet s) {
        StringBuilder messages = new StringBuilder();
        StringBuilder trace = new StringBuilder();
        shell.diagnostics(s).forEach(d -> {
            String m = d.getMessage(Locale.ROOT);
            messages.append(messages.length() == 0 ? "" : "\n").append(m);
            trace.append(located(s.source(), d)).append('\n').append(m).append('\n');
        });
        return error("CompilationException", messages.toString(), trace.toString());
    }

    /// The source line of a diagnostic with a caret under its position.
    static String located(String source, Diag d) {
        int at = (int) Math.max(0, Math.min(d.getStartPosition(), source.length()));
        int start = source.lastIndexOf('\n', at - 1) + 1;
        int end = source.indexOf('\n', at);
        String line = source.substring(start, end < 0 ? source.length() : end);
        return line + "\n" + " ".repeat(at - start) + "^";
    }

    static String thrown(JShellException ex) {
        String name;
        if (ex instanceof EvalException) {
            name = ((EvalException) ex).getExceptionClassName();
        } else if (ex instanceof UnresolvedReferenceException) {
            name = "UnresolvedReferenceException";
        } else {
            name = ex.getClass().getName();
        }
        String message = ex.getMessage() == null ? "" : ex.getMessage();
        StringBuilder trace = new StringBuilder(name);
        if (!message.isEmpty()) {
            trace.append(": ").append(message);
        }
        for (StackTraceElement el : ex.getStackTrace()) {
            trace.append("\n\tat ").append(el);
        }
        for (Throwable cause = ex.getCause(); cause != null; cause = cause.getCause()) {
            trace.append("\nCaused by: ").append(cause);
        }
        return error(name, message, trace.toString());
    }

    static String error(String name, String value, String traceback) {
        return "{\"name\":" + quote(name) + ",\"value\":" + quote(clip(value, MAX_ERROR_VALUE))
                + ",\"traceback\":" + quote(clip(traceback, MAX_TRACEBACK)) + "}";
    }

    /// One NUL-terminated field, or null at the end of the input.
    static String field(InputStream in) throws IOException {
        ByteArrayOutputStream buf = new ByteArrayOutputStream();
        for (int b = in.read(); b != 0; b = in.read()) {
            if (b < 0) {
                return null;
            }
            buf.write(b);
        }
        return buf.toString(StandardCharsets.UTF_8);
    }

    static void emit(String json) throws IOException {
        synchronized (KoderDriver.class) {
            events.write((json + "\n").getBytes(StandardCharsets.US_ASCII));
            events.flush();
        }
    }

    static String clip(String s, int limit) {
        if (s.length() <= limit) {
            return s;
        }
        return s.substring(0, limit) + "\n[... " + (s.length() - limit) + " characters cut]";
    }

    /// A JSON string of ASCII only: events are ASCII lines whatever the code printed.
    static String quote(String s) {
        StringBuilder out = new StringBuilder(s.length() + 2).append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c == '"' || c == '\\') {
                out.append('\\').append(c);
            } else if (c >= 0x20 && c < 0x7f) {
                out.append(c);
            } else {
                out.append(String.format("\\u%04x", (int) c));
            }
        }
        return out.append('"').toString();
    }

    /// The text of a Java string literal's body, as JShell escapes it.
    static String unescape(String s) {
        StringBuilder out = new StringBuilder(s.length());
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c != '\\' || i + 1 == s.length()) {
                out.append(c);
                continue;
            }
            char e = s.charAt(++i);
            switch (e) {
                case 'b': out.append('\b'); break;
                case 't': out.append('\t'); break;
                case 'n': out.append('\n'); break;
                case 'f': out.append('\f'); break;
                case 'r': out.append('\r'); break;
                case 's': out.append(' '); break;
                case 'u': {
                    int j = i + 1;
                    while (j < s.length() && s.charAt(j) == 'u') {
                        j++;
                    }
                    if (j + 4 <= s.length()) {
                        try {
                            out.append((char) Integer.parseInt(s.substring(j, j + 4), 16));
                            i = j + 3;
                            break;
                        } catch (NumberFormatException ignored) {
                            // Not an escape after all: kept as written.
                        }
                    }
                    out.append('\\').append(e);
                    break;
                }
                default:
                    if (e >= '0' && e <= '7') {
                        int j = i;
                        int max = e <= '3' ? 3 : 2;
                        while (j < s.length() && j - i < max && s.charAt(j) >= '0' && s.charAt(j) <= '7') {
                            j++;
                        }
                        out.append((char) Integer.parseInt(s.substring(i, j), 8));
                        i = j - 1;
                    } else {
                        out.append(e);
                    }
            }
        }
        return out.toString();
    }
}
