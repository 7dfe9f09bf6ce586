# koder-sandbox code-interpreter driver for R, run by the agent as `Rscript --no-save
# --no-restore /proc/self/fd/5` (the site's Renviron and profile are read, as at R's prompt).
#
# A context is one R session: objects, functions, loaded packages and the working directory one
# run leaves are there for the next, as in E2B's R kernel. R reads no JSON without a package, so
# requests arrive NUL-separated on fd 3 as for bash: the run's number, the size of its code in
# bytes, the code itself (read in one piece: byte by byte R would take seconds for a large
# cell), then `NAME=value` fields up to an empty one. Events leave one JSON object per line on fd 4. Each
# top-level expression is evaluated in turn and a visible value printed, as at R's prompt; the
# last one's printed form is the run's result instead (`[1] "x"`), as E2B's kernel shows it.
local({
  ctl_in <- file("/proc/self/fd/3", open = "rb", raw = TRUE)
  ctl_out <- file("/proc/self/fd/4", open = "wb", raw = TRUE)
  max_text <- 256 * 1024
  max_error_value <- 16 * 1024
  max_traceback <- 64 * 1024

  # A JSON string of ASCII only: events are ASCII lines whatever the code printed.
  json_str <- function(s) {
    cps <- utf8ToInt(enc2utf8(s))
    if (length(cps) == 0 || anyNA(cps)) {
      return('""')
    }
    out <- vapply(cps, function(cp) {
      if (cp == 34L) "\\\"" else if (cp == 92L) "\\\\"
      else if (cp >= 32L && cp < 127L) intToUtf8(cp)
      else if (cp < 65536L) sprintf("\\u%04x", cp)
      else {
        v <- cp - 65536L
        sprintf("\\u%04x\\u%04x", 55296L + v %/% 1024L, 56320L + v %% 1024L)
      }
    }, "")
    paste0('"', paste(out, collapse = ""), '"')
  }
  clip <- function(s, limit) {
    if (nchar(s) <= limit) s
    else paste0(substr(s, 1, limit), "\n[... ", nchar(s) - limit, " characters cut]")
  }
  emit <- function(json) {
    writeBin(charToRaw(paste0(json, "\n")), ctl_out)
    flush(ctl_out)
  }
  # One NUL-terminated field, or NULL at the end of the input.
  field <- function() {
    # Grown by doubling: appending byte by byte would copy the field once per byte.
    bytes <- raw(256)
    len <- 0L
    repeat {
      b <- readBin(ctl_in, "raw", 1L)
      if (length(b) == 0) return(NULL)
      if (b == as.raw(0)) break
      if (len == length(bytes)) bytes <- c(bytes, raw(len))
      len <- len + 1L
      bytes[len] <- b
    }
    s <- rawToChar(bytes[seq_len(len)])
    Encoding(s) <- "UTF-8"
    s
  }
  shown <- function(value) paste(utils::capture.output(print(value)), collapse = "\n")

  # Plots are drawn into PNG files (a sandbox has no screen, and Rscript's default device is a
  # PDF file nobody sees) and become results of the run that drew them, as in E2B's R kernel
  # (IRkernel's size: 7 inches square at 120 dpi). The device opens with the first plot of a
  # run; a run that draws nothing pays nothing.
  plot_dir <- file.path(tempdir(), "koder-plots")
  dir.create(plot_dir, showWarnings = FALSE)
  options(device = function(...) {
    grDevices::png(file.path(plot_dir, "plot-%03d.png"), width = 7, height = 7, units = "in", res = 120)
  })
  # Base R has no base64 encoder; this one works on whole vectors (a plot's bytes at once).
  b64_chars <- c(LETTERS, letters, 0:9, "+", "/")
  b64 <- function(bytes) {
    pad <- (3L - length(bytes) %% 3L) %% 3L
    m <- matrix(as.integer(c(bytes, raw(pad))), nrow = 3L)
    idx <- rbind(m[1, ] %/% 4L, (m[1, ] %% 4L) * 16L + m[2, ] %/% 16L,
                 (m[2, ] %% 16L) * 4L + m[3, ] %/% 64L, m[3, ] %% 64L)
    out <- b64_chars[as.vector(idx) + 1L]
    if (pad > 0L) out[(length(out) - pad + 1L):length(out)] <- "="
    paste(out, collapse = "")
  }
  # The run's pages, in order: the devices are closed (which writes the last page) and each
  # page's PNG becomes a result.
  # At most `max_plots` of them: more would not fit in the run's results anyway, and encoding
  # each costs milliseconds.
  max_plots <- 32L
  emit_plots <- function(n) {
    if (grDevices::dev.cur() > 1L) grDevices::graphics.off()
    pages <- sort(list.files(plot_dir, full.names = TRUE))
    for (f in utils::head(pages, max_plots)) {
      bytes <- readBin(f, "raw", file.info(f)$size)
      if (length(bytes) > 0L) {
        emit(sprintf('{"ev":"display","n":%s,"main":false,"data":{"png":"%s","text":"plot without title"}}', n, b64(bytes)))
      }
    }
    if (length(pages) > max_plots) {
      emit(sprintf('{"ev":"display","n":%s,"main":false,"data":{"text":"[%d more plots not shown]"}}', n, length(pages) - max_plots))
    }
    unlink(pages)
  }
  # A data frame or matrix as the cell's value is also an HTML and a Markdown table, as
  # IRkernel (through the repr package) shows one: a caption with the class and dimensions, a
  # row of column types for a data frame, at most 60 rows (the first and last 30) and 20
  # columns (the first and last 10), elided rows and columns marked with an ellipsis.
  max_table_rows <- 60L
  max_table_cols <- 20L
  type_abbrev <- function(col) {
    if (is.factor(col)) "fct"
    else if (inherits(col, "POSIXt")) "dttm"
    else if (inherits(col, "Date")) "date"
    else switch(typeof(col), integer = "int", double = "dbl", character = "chr",
                logical = "lgl", complex = "cpl", list = "list", typeof(col))
  }
  html_escape <- function(s) {
    s <- gsub("&", "&amp;", s, fixed = TRUE)
    s <- gsub("<", "&lt;", s, fixed = TRUE)
    gsub(">", "&gt;", s, fixed = TRUE)
  }
  # The indexes shown of `n`, with NA where the elided ones are.
  kept <- function(n, limit) {
    if (n <= limit) seq_len(n)
    else c(seq_len(limit %/% 2L), NA, (n - limit %/% 2L + 1L):n)
  }
  table_forms <- function(x) {
    frame <- is.data.frame(x)
    if (!frame && !(is.matrix(x) && is.atomic(x))) return(NULL)
    if (ncol(x) == 0L) return(NULL)  # R's printed form says it all
    rows <- kept(nrow(x), max_table_rows)
    cols <- kept(ncol(x), max_table_cols)
    cell <- function(j) {
      if (is.na(j)) return(rep("\u22ef", length(rows)))
      col <- if (frame) x[[j]] else x[, j]
      text <- vapply(rows, function(i) {
        if (is.na(i)) return("\u22ee")
        v <- if (is.list(col)) col[[i]] else col[i]
        paste(format(v, trim = TRUE), collapse = ", ")
      }, "")
      html_escape(text)
    }
    body <- do.call(cbind, lapply(cols, cell))
    col_names <- colnames(x)
    header <- if (is.null(col_names)) NULL
              else vapply(cols, function(j) if (is.na(j)) "\u22ef" else html_escape(col_names[j]), "")
    types <- if (frame) {
      vapply(cols, function(j) if (is.na(j)) "" else paste0("&lt;", type_abbrev(x[[j]]), "&gt;"), "")
    }
    row_names <- if (frame || !is.null(rownames(x))) {
      all <- if (frame) row.names(x) else rownames(x)
      vapply(rows, function(i) if (is.na(i)) "\u22ee" else html_escape(all[i]), "")
    }
    caption <- sprintf("A %s: %d \u00d7 %d%s", class(x)[1], nrow(x), ncol(x),
                       if (frame) "" else paste0(" of type ", type_abbrev(as.vector(x[0]))))
    th <- function(v, scope) paste0("<th", if (nzchar(scope)) paste0(" scope=", scope), ">", v, "</th>", collapse = "")
    lead <- if (is.null(row_names)) "" else "<th></th>"
    html <- c('<table class="dataframe">', paste0("<caption>", caption, "</caption>"))
    if (!is.null(header)) {
      html <- c(html, "<thead>", paste0("\t<tr>", lead, th(header, "col"), "</tr>"))
      if (!is.null(types)) html <- c(html, paste0("\t<tr>", lead, th(types, "col"), "</tr>"))
      html <- c(html, "</thead>")
    }
    html <- c(html, "<tbody>", vapply(seq_along(rows), function(r) {
      paste0("\t<tr>", if (is.null(row_names)) "" else th(row_names[r], "row"),
             paste0("<td>", body[r, ], "</td>", collapse = ""), "</tr>")
    }, ""), "</tbody>", "</table>")
    md_head <- if (is.null(header)) rep("", length(cols))
               else if (is.null(types)) header else trimws(paste(header, types))
    md_cells <- function(v) paste0("| ", paste(gsub("|", "\\|", v, fixed = TRUE), collapse = " | "), " |")
    lead_md <- if (is.null(row_names)) NULL else "<!--/-->"
    md <- c(caption, "", md_cells(c(lead_md, md_head)),
            paste0("|", paste(rep("---", length(cols) + !is.null(row_names)), collapse = "|"), "|"),
            vapply(seq_along(rows), function(r) md_cells(c(row_names[r], body[r, ])), ""))
    list(html = paste(html, collapse = "\n"), markdown = paste(md, collapse = "\n"))
  }
  error_json <- function(name, value, traceback) {
    sprintf('{"name":%s,"value":%s,"traceback":%s}', json_str(name),
            json_str(clip(value, max_error_value)), json_str(clip(traceback, max_traceback)))
  }
  # Runs the code expression by expression in the global environment; the first error ends it.
  run <- function(n, code) {
    exprs <- tryCatch(parse(text = code, keep.source = FALSE), error = function(e) e)
    if (inherits(exprs, "error")) {
      return(list(error = error_json("SyntaxError", conditionMessage(exprs), conditionMessage(exprs))))
    }
    last <- NULL
    last_value <- NULL
    for (i in seq_along(exprs)) {
      # A value followed by more code is printed, as at R's prompt, before that code runs.
      if (!is.null(last)) {
        if (nzchar(last)) cat(last, "\n", sep = "")
        last <- NULL
      }
      # The value is printed within the same handlers: a print method is user code too.
      last_value <- NULL
      outcome <- tryCatch(
        withCallingHandlers({
          v <- withVisible(eval(exprs[[i]], envir = globalenv()))
          if (v$visible) last_value <- v$value
          if (v$visible) shown(v$value) else NULL
        }, warning = function(w) {
          message("Warning message:\n", conditionMessage(w))
          invokeRestart("muffleWarning")
        }),
        error = function(e) e,
        interrupt = function(e) e
      )
      if (inherits(outcome, "interrupt")) {
        return(list(error = error_json("Interrupted", "the run was interrupted", "")))
      }
      if (inherits(outcome, "error")) {
        # As R's prompt says it; an error raised at top level names no call (its call is
        # this driver's eval).
        call <- conditionCall(outcome)
        msg <- conditionMessage(outcome)
        top <- is.null(call) || identical(call[[1]], quote(eval))
        said <- if (top) paste0("Error: ", msg)
                else paste0("Error in ", paste(deparse(call), collapse = "\n"), " : ", msg)
        return(list(error = error_json("Error", msg, said)))
      }
      last <- outcome
    }
    # A plot comes before the value, as it was drawn before; a value that prints nothing (a
    # ggplot, whose print draws it) is no result.
    emit_plots(n)
    if (!is.null(last) && nzchar(last)) {
      data <- paste0('"text":', json_str(clip(last, max_text)))
      forms <- tryCatch(table_forms(last_value), error = function(e) NULL)
      for (key in names(forms)) {
        if (nchar(forms[[key]]) <= max_text) data <- paste0(data, ',"', key, '":', json_str(forms[[key]]))
      }
      emit(sprintf('{"ev":"display","n":%s,"main":true,"data":{%s}}', n, data))
    }
    list(error = "null")
  }

  emit(sprintf('{"ev":"ready","pid":%d,"version":%s}', Sys.getpid(),
               json_str(paste(R.version$major, R.version$minor, sep = "."))))
  repeat {
    n <- field()
    size <- field()
    if (is.null(n) || is.null(size)) break
    code <- rawToChar(readBin(ctl_in, "raw", as.integer(size)))
    Encoding(code) <- "UTF-8"
    saved <- list()
    repeat {
      kv <- field()
      if (is.null(kv) || kv == "") break
      eq <- regexpr("=", kv, fixed = TRUE)
      key <- if (eq < 0) kv else substr(kv, 1, eq - 1)
      value <- if (eq < 0) "" else substr(kv, eq + 1, nchar(kv))
      saved[[key]] <- Sys.getenv(key, unset = NA)
      do.call(Sys.setenv, stats::setNames(list(value), key))
    }
    result <- run(n, code)
    # What a run that failed had drawn (a finished run sent its plots already).
    emit_plots(n)
    flush(stdout())
    flush(stderr())
    for (key in names(saved)) {
      if (is.na(saved[[key]])) Sys.unsetenv(key)
      else do.call(Sys.setenv, stats::setNames(list(saved[[key]]), key))
    }
    emit(sprintf('{"ev":"done","n":%s,"error":%s}', n, result$error))
  }
})
