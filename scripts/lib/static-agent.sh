# shellcheck shell=bash
# The sandbox agent as one static executable, for the scripts that start daemons: source this
# file from the repository root, then `static_agent PROFILE` (dev or release). It builds the
# agent and exports KODER_AGENT_BIN, which the daemon (and the jail tests) start sandboxes with.
#
# Why: the agent is exec'd as PID 1 of every sandbox. Linked statically it skips the loader's
# mapping of libc, libm and libgcc_s (about 40 page faults, each a trap to the hypervisor on a
# virtualised host): 0.37 ms less per sandbox start here (BENCHMARKS.md). `crt-static` is a flag
# of a whole cargo invocation, and on the workspace build it would make the daemon static too
# (its name lookups go through glibc's NSS) and break proc macros, so the agent gets a build of
# its own for the host's target triple, under target/<triple>/, which the workspace build never
# overwrites. A plain `cargo build` still puts a dynamic agent next to the daemon, the default
# when KODER_AGENT_BIN is unset; both run the same code.
static_agent() {
  local profile=$1 triple dir
  triple=$(rustc -vV | sed -n 's/^host: //p')
  RUSTFLAGS="-C target-feature=+crt-static" cargo build --locked -p koder-agent --bin koder-agent \
    --profile "$profile" --target "$triple"
  dir=$profile
  [ "$profile" = dev ] && dir=debug
  KODER_AGENT_BIN="$PWD/target/$triple/$dir/koder-agent"
  # A flag that stopped applying would still give a working agent: say so instead.
  if [[ $(readelf -l "$KODER_AGENT_BIN") == *INTERP* ]]; then
    echo "static_agent: $KODER_AGENT_BIN has a program interpreter: not linked statically" >&2
    return 1
  fi
  export KODER_AGENT_BIN
}
