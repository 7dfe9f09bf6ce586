"""pytest plugin of scripts/e2b-upstream-tests.sh: name resolution as the sandbox domain's
wildcard DNS record would give it, without any DNS; and each test's outcome by node id.

KODER_E2B_HOSTS="<domain>=<address>": every name under <domain> (E2B's `<port>-<id>.<domain>`
host names) resolves to <address>, the daemon's HTTPS listener on loopback. `localhost` and
loopback address literals resolve as usual. Every other name or address is refused, so
nothing the suite does from this process can reach a resolver or a host off this machine.
Without it (scripts/e2b-template-tests.sh, whose SDK calls name the daemon's address), every
name but `localhost` and loopback literals is refused.

KODER_E2B_RESULTS=<file>: `{node id: "passed" | "failed" | "skipped"}` as JSON at the end.
"""

import ipaddress
import json
import os
import socket

_real_getaddrinfo = socket.getaddrinfo


def _is_loopback(name):
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def pytest_configure(config):
    hosts = os.environ.get("KODER_E2B_HOSTS")
    domain, _, address = (hosts or "").partition("=")
    domain = domain.rstrip(".").lower()
    if hosts is not None and (not domain or not _is_loopback(address)):
        raise RuntimeError("KODER_E2B_HOSTS must be <domain>=<loopback address>")

    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
        name = host.decode() if isinstance(host, bytes) else host
        if name is not None:
            lowered = name.rstrip(".").lower()
            if domain and (lowered == domain or lowered.endswith("." + domain)):
                return _real_getaddrinfo(address, port, family, type, proto, flags)
            if not _is_loopback(lowered):
                raise socket.gaierror(
                    socket.EAI_NONAME,
                    f"{name}: not resolved in this run (nothing may leave this machine)",
                )
        return _real_getaddrinfo(host, port, family, type, proto, flags)

    socket.getaddrinfo = getaddrinfo


_outcomes = {}


def pytest_runtest_logreport(report):
    # A failure in any phase fails the test; a skip in setup is the test's outcome.
    if report.failed:
        _outcomes[report.nodeid] = "failed"
    elif report.when == "call" or (report.when == "setup" and report.skipped):
        _outcomes.setdefault(report.nodeid, report.outcome)


def pytest_sessionfinish(session):
    path = os.environ.get("KODER_E2B_RESULTS")
    if path:
        with open(path, "w") as f:
            json.dump(_outcomes, f, indent=1, sort_keys=True)
