# shellcheck shell=bash
# What the runners of E2B's JS suites share (scripts/e2b-upstream-js-tests.sh for E2B's JS SDK,
# scripts/e2b-code-interpreter-js-tests.sh for the code-interpreter's): the SDK's dependencies
# at the versions of the suite's own pnpm lock file, installed once into the test cache, and
# vitest's JSON reports read as the outcomes upstream_verdict takes. Source from the repository
# root after scripts/lib/e2b-upstream.sh.

# Installs the dependencies of PACKAGE_JSON plus EXTRA... (test tools the suite imports) at the
# versions the lock file LOCK pins for its importer IMPORTER (e.g. `packages/js-sdk`), once per
# set of versions, and links them as DIR/node_modules.
upstream_js_modules() {
  local dir=$1 package=$2 lock=$3 importer=$4 deps key modules
  shift 4
  deps=$(/usr/bin/python3 - "$package" "$lock" "$importer" "$@" <<'PY'
import json
import re
import sys

package, lock = json.load(open(sys.argv[1])), open(sys.argv[2]).read()
importer_name = re.escape(sys.argv[3])
importer = re.search(rf"^  {importer_name}:\n(.*?)(?=^  \S|\Z)", lock, re.M | re.S).group(1)
pinned = {}
for name in list(package.get("dependencies", {})) + sys.argv[4:]:
    quoted = re.escape(f"'{name}'") if name.startswith("@") else re.escape(name)
    m = re.search(rf"^      {quoted}:\n        specifier: .*\n        version: ([^(\s]+)", importer, re.M)
    if not m:
        sys.exit(f"{name} is not in the lock file's {sys.argv[3]} importer")
    pinned[name] = m.group(1)
print(json.dumps({"name": "koder-e2b-upstream-js", "private": True, "dependencies": pinned},
                 indent=1, sort_keys=True))
PY
  )
  key=$(printf '%s\n' "$deps" | sha256sum | cut -c1-16)
  modules="${KODER_TEST_CACHE:-/var/cache/koder-sandbox-test}/e2b-upstream-js-$key"
  # The stamp is written last, so a half-made install is redone rather than trusted.
  if [ ! -f "$modules/.installed" ]; then
    rm -rf "$modules"
    mkdir -p "$modules"
    printf '%s\n' "$deps" >"$modules/package.json"
    npm install --prefix "$modules" --no-audit --no-fund --loglevel=error >/dev/null
    touch "$modules/.installed"
  fi
  ln -s "$modules/node_modules" "$dir/node_modules"
}

# vitest's JSON reports REPORT... of tests under ROOT/ as `{"<file> > <full name>": outcome}`.
upstream_vitest_results() {
  /usr/bin/python3 - "$@" <<'PY'
import json
import sys

root, reports = sys.argv[1], [json.load(open(path)) for path in sys.argv[2:]]
outcomes = {}
for suite in (suite for report in reports for suite in report["testResults"]):
    file = suite["name"].removeprefix(root)
    for t in suite["assertionResults"]:
        status = {"passed": "passed", "failed": "failed"}.get(t["status"], "skipped")
        if status == "skipped" and t["status"] not in ("skipped", "pending", "todo"):
            continue
        name = " > ".join([file, *t["ancestorTitles"], t["title"]])
        # Tests of one name (a parameterised title) count one each: #2, #3...
        n, unique = 1, name
        while unique in outcomes:
            n += 1
            unique = f"{name} #{n}"
        outcomes[unique] = status
    # A file that failed to load has no tests to report, and is a failure of its own.
    if suite["status"] == "failed" and not suite["assertionResults"]:
        outcomes[f"{file} > (the file)"] = "failed"
print(json.dumps(outcomes, indent=1, sort_keys=True))
PY
}
