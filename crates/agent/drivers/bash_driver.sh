# koder-sandbox code-interpreter driver for bash, run by the agent's bootstrap in `bash -c`.
#
# A context is one long-lived shell: variables, functions, the directory and options set by one
# run are there for the next, as in E2B's bash kernel. Bash cannot parse JSON, so requests
# arrive NUL-separated on fd 3: the run's number, its code, then `NAME=value` fields of the run's
# own variables up to an empty field. Events leave one JSON object per line on fd 4 (nothing
# user-controlled is written into them). fds 1 and 2 are the agent's pipes for user output.

# The control channel moves out of the way; runs see it closed, so neither user code nor the
# processes it starts (which could outlive the run) hold it open.
exec 10<&3 11>&4 3<&- 4>&-
unset __koder_driver

__koder_run() {
	# SIGINT (the agent cancelling the run) ends the run, not the shell.
	trap 'return 130' INT
	eval "$1"
}

# Between runs SIGINT is caught, not ignored: processes started later must not inherit an
# ignored SIGINT.
trap ':' INT
printf '{"ev":"ready","pid":%d,"version":"%s"}\n' "$$" "${BASH_VERSINFO[0]}.${BASH_VERSINFO[1]}.${BASH_VERSINFO[2]}" >&11

while IFS= read -r -d '' __koder_n <&10 && IFS= read -r -d '' __koder_code <&10; do
	# The run's own variables: set for it, put back as they were once it ends.
	__koder_saved=()
	while IFS= read -r -d '' __koder_kv <&10 && [ -n "$__koder_kv" ]; do
		__koder_k=${__koder_kv%%=*}
		if [ -n "${!__koder_k+set}" ]; then
			__koder_saved+=("$__koder_k=${!__koder_k}")
		else
			__koder_saved+=("$__koder_k")
		fi
		export "$__koder_kv"
	done
	__koder_run "$__koder_code" 10<&- 11>&-
	__koder_status=$?
	trap ':' INT
	for __koder_kv in "${__koder_saved[@]}"; do
		case $__koder_kv in
		*=*) export "$__koder_kv" ;;
		*) unset "$__koder_kv" ;;
		esac
	done
	# As Jupyter's bash kernel: a run whose last command failed ends with an error whose value
	# is the exit status.
	if [ "$__koder_status" -eq 0 ]; then
		__koder_error=null
	else
		__koder_error='{"name":"ExitCode","value":"'$__koder_status'","traceback":""}'
	fi
	printf '{"ev":"done","n":%d,"error":%s}\n' "$__koder_n" "$__koder_error" >&11
done
exit 0
